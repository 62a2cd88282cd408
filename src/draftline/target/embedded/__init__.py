"""The embedded target: a tiny Qwen3-architecture model and its BPE tokenizer, trained on the CPU from the
sources' conversations, so that the whole pipeline runs without a GPU or a hub (``params``, ``tokenizer``,
``build``; the chat template ``chat_template.jinja`` ships beside them)."""
