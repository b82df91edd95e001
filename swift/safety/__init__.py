"""The safety toolkit: jailbreak attacks (`swift attack`) and rare-output estimation (`swift estimate`)."""
