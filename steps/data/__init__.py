"""Data steps: raw sources and their mirrors, dedupe, decontaminate, tokenize, mixture."""
