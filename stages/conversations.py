"""DVC stage `conversations@<name>`: python stages/conversations.py <name>
(reads params.yaml: sources.<name>, conversations)."""

import sys

from draftline.conversations.stage import ConversationsParams, run_conversations
from draftline.core.source_spec import load_source

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python stages/conversations.py <source name from params.yaml: sources>")
    run_conversations(sys.argv[1], load_source(sys.argv[1]), ConversationsParams.load("conversations"))
