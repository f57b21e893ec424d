"""Patch sets: files bind-mounted over an engine image, pinned by sha256 in a manifest."""
