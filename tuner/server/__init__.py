"""The server under test: its process, memory cap, GPU, outcome classes."""
