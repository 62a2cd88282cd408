"""DVC stage `conversations@<name>`: one source's rows adapted into conversations (reads params.yaml:
sources.<name>, conversations). Its paths come from dvc.yaml."""

from draftline.conversations.params import load
from draftline.conversations.stage import ConversationsArgs, run_conversations
from draftline.core.runner import main

if __name__ == "__main__":
    main("conversations", ConversationsArgs, load, run_conversations)
