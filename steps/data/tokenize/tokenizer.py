"""The tokenizer of the tokenize step: a Hugging Face `tokenizers` tokenizer with its bos/eos ids.

Loaded from a local directory (`tokenizer.json` and its special-tokens files) or, where the hub
is reachable, by name; once per process.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from steps.data.tokenize.common import TokenizeError

__all__ = ["LoadedTokenizer", "load_tokenizer", "resolve_tokenizer"]


@dataclass
class LoadedTokenizer:
    """A loaded tokenizer and the ids every document is wrapped in (`[bos] + tokens + [eos]`)."""

    backend: Any
    bos_id: int | None
    eos_id: int
    vocab_size: int
    spec: str = ""
    """The tokenizer as given (a directory or a Hub name): what the mixture's data config names."""

    def encode_flat(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Every text's ids, each wrapped in bos/eos, end to end in one int32 array, and each
        text's end offset in it: what a token cache stores, made without a list or an array per
        text (at the tokenizer's speed, per-text objects cost a tenth of the step's time)."""
        bos, eos = self.bos_id, self.eos_id
        flat: list[int] = []
        ends: list[int] = []
        for encoding in self.backend.encode_batch(texts, add_special_tokens=False):
            if bos is not None:
                flat.append(bos)
            flat.extend(encoding.ids)
            flat.append(eos)
            ends.append(len(flat))
        return np.array(flat, dtype=np.int32), np.array(ends, dtype=np.int64)

    @property
    def info(self) -> dict[str, Any]:
        return {"vocab_size": self.vocab_size, "bos_id": self.bos_id, "eos_id": self.eos_id}

    @property
    def metadata(self) -> dict[str, Any]:
        """The cache ledger's preprocessor metadata, in the form Levanter's own tokenizer writes
        (`BatchTokenizer.metadata`), so that training reading this cache through the mixture's
        data config (which names the same tokenizer) finds no "Metadata mismatch" to warn about."""
        return {
            "tokenizer": self.spec,
            "vocab_size": self.backend.get_vocab_size(with_added_tokens=False),
            "return_attention_mask": False,
            "padding": False,
            "max_length": None,
            "append_bos": self.bos_id is not None,
            "append_eos": True,
        }


_TOKENIZERS: dict[str, LoadedTokenizer] = {}


def load_tokenizer(spec: str) -> LoadedTokenizer:
    """Load (once per process) a tokenizer from a local directory or, if reachable, the hub."""
    if spec in _TOKENIZERS:
        return _TOKENIZERS[spec]
    from tokenizers import Tokenizer

    if os.path.isdir(spec):
        path = os.path.join(spec, "tokenizer.json")
        try:
            backend = Tokenizer.from_file(path)
        except Exception as e:
            raise TokenizeError(f"tokenizer {spec!r} is unreadable: {path}: {e}") from e
        special = _special_tokens(spec)
    elif os.path.sep in spec and not _looks_like_hub_name(spec):
        raise TokenizeError(f"tokenizer {spec!r} is not a directory")
    else:
        try:
            backend = Tokenizer.from_pretrained(spec)
            special = _hub_special_tokens(spec)
        except Exception as e:
            raise TokenizeError(
                f"tokenizer {spec!r} is not a local directory and could not be fetched from the Hugging Face "
                f"hub ({type(e).__name__}); the hub may be unreachable from here: pass a local tokenizer "
                "directory instead"
            ) from e
    eos = special.get("eos_token")
    eos_id = backend.token_to_id(eos) if eos else None
    if eos_id is None:
        raise TokenizeError(f"tokenizer {spec!r} has no eos_token in its tokenizer_config.json")
    bos = special.get("bos_token")
    bos_id = backend.token_to_id(bos) if bos else None
    tok = LoadedTokenizer(backend, bos_id, eos_id, backend.get_vocab_size(with_added_tokens=True), spec)
    _TOKENIZERS[spec] = tok
    return tok


def resolve_tokenizer(spec: str, root: str | None) -> str:
    """An absolute directory for a local tokenizer (relative ones are under `root`); names stay names."""
    if "://" in spec:
        return spec
    candidate = spec if os.path.isabs(spec) or root is None else os.path.join(root, spec)
    return os.path.abspath(candidate) if os.path.isdir(candidate) else spec


def _looks_like_hub_name(spec: str) -> bool:
    return spec.count("/") == 1 and not spec.startswith((".", "/"))


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # {"content": "<|endoftext|>", ...}
        return value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(directory: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            with open(os.path.join(directory, name)) as f:
                raw = json.load(f)
        except FileNotFoundError:
            continue
        except ValueError as e:
            raise TokenizeError(f"tokenizer {directory!r}: {name} is not valid JSON ({e})") from e
        for key in ("bos_token", "eos_token"):
            text = _token_text(raw.get(key))
            if text:
                out[key] = text
    return out


def _hub_special_tokens(name: str) -> dict[str, str]:
    from huggingface_hub import hf_hub_download

    return _special_tokens(os.path.dirname(hf_hub_download(name, "tokenizer_config.json")))
