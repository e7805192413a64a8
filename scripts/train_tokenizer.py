"""Train the default demo tokenizer: a small byte-level BPE on the train shards of data/corpus/.

    python scripts/train_tokenizer.py                   # writes data/tokenizer/ (deterministic)
    python scripts/train_tokenizer.py --vocab-size 4096 --out /tmp/tok

The result is a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json,
special_tokens_map.json) that loads offline with ``transformers.AutoTokenizer.from_pretrained(dir)``
and with Levanter's ``levanter.tokenizers.load_tokenizer(dir)``.

Design, GPT-2 style:

- byte-level BPE: every string round-trips, nothing is ever unknown;
- numbers are split into single digits before BPE, so `` 123`` is always `` 1``, ``2``, ``3``
  (arithmetic stays learnable; ``--no-split-digits`` gives plain GPT-2 pre-tokenization);
- special tokens: ``<|endoftext|>`` (id 0) is both BOS and EOS, ``<|pad|>`` (id 1) is padding;
- no post-processor adds tokens: ``encode(text)`` is just the text. Levanter's tokenize step adds
  BOS in front of and EOS after every document itself.

The same corpus and arguments always produce byte-identical files.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CORPUS = REPO / "data" / "corpus"
DEFAULT_OUT = REPO / "data" / "tokenizer"

EOS = "<|endoftext|>"
PAD = "<|pad|>"
# transformers' "no limit" sentinel (VERY_LARGE_INTEGER); the training step sets the real context.
MODEL_MAX_LENGTH = int(1e30)
# GPT-2's pre-tokenizer pattern with one change: ` ?\p{N}` (one digit) instead of ` ?\p{N}+`, so
# numbers are split into digits while a leading space still joins the first digit (" 47" -> " 4", "7").
SPLIT_DIGITS_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def read_docs(files: list[Path]) -> list[str]:
    docs = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            docs.extend(json.loads(line)["text"] for line in fh if line.strip())
    return docs


def train(docs: list[str], vocab_size: int, split_digits: bool, min_frequency: int):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    if split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(SPLIT_DIGITS_PATTERN), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    return tok


def save(tok, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=None,
        pad_token=PAD,
        model_max_length=MODEL_MAX_LENGTH,
        clean_up_tokenization_spaces=False,
        add_prefix_space=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (out / stale).unlink(missing_ok=True)
    hf.save_pretrained(str(out))


def verify(out: Path, domains: dict[str, list[str]]) -> None:
    """Load the saved directory the way users will (offline) and check it end to end."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    assert hf.is_fast, type(hf)
    assert hf.eos_token == EOS and hf.bos_token == EOS and hf.pad_token == PAD, hf.special_tokens_map
    assert hf.eos_token_id == hf.bos_token_id == 0 and hf.pad_token_id == 1
    assert hf("hello")["input_ids"] == hf.encode("hello", add_special_tokens=False), (
        "post-processor adds tokens"
    )
    print(f"transformers: {type(hf).__name__}, len={len(hf)}, vocab_size={hf.vocab_size}")
    for role in ("bos", "eos", "pad"):
        print(f"  {role}_token={getattr(hf, role + '_token')!r} id={getattr(hf, role + '_token_id')}")

    for name, docs in domains.items():
        n_tok = n_chars = 0
        for text in docs:
            ids = hf.encode(text, add_special_tokens=False)
            back = hf.decode(ids)
            assert back == text, f"round trip failed in {name}: {text[:80]!r} -> {back[:80]!r}"
            n_tok += len(ids)
            n_chars += len(text)
        print(
            f"  {name:24s} docs={len(docs):5d} tokens={n_tok:8d} tokens/doc={n_tok / len(docs):6.1f}"
            f" chars/token={n_chars / n_tok:4.2f}"
        )
    odd = "Ünïcödé ✓ 🚀\ttabs\n\nand  spaces 12345"
    assert hf.decode(hf.encode(odd)) == odd, "byte-level round trip of unseen characters failed"
    with_eos = hf.encode(f"1 + 1 = 2 {EOS}")
    assert with_eos[-1] == hf.eos_token_id, with_eos

    try:
        from levanter.tokenizers import load_tokenizer
    except ImportError:
        print("levanter not installed: skipped the Levanter check")
        return
    lev = load_tokenizer(str(out))
    assert lev.eos_token_id == hf.eos_token_id and lev.bos_token_id == hf.bos_token_id
    assert lev.pad_token_id == hf.pad_token_id and lev.vocab_size == len(hf)
    sample = next(iter(domains.values()))[0]
    assert lev.encode(sample) == hf.encode(sample, add_special_tokens=False)
    ids = (lev.bos_token_id, lev.eos_token_id, lev.pad_token_id)
    print(f"levanter: {type(lev).__name__}, vocab_size={lev.vocab_size}, bos/eos/pad ids={ids}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="directory of <domain>/*.jsonl")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--vocab-size", type=int, default=2048, help="total, including the special tokens")
    ap.add_argument("--min-frequency", type=int, default=2)
    ap.add_argument("--no-split-digits", dest="split_digits", action="store_false")
    ap.add_argument("--no-verify", dest="verify", action="store_false")
    args = ap.parse_args(argv)

    train_files = sorted(args.corpus.glob("*/train-*.jsonl"))
    if not train_files:
        print(f"no train shards under {args.corpus}; run scripts/make_corpus.py first", file=sys.stderr)
        return 1
    docs = read_docs(train_files)
    print(f"training on {len(docs)} documents from {len(train_files)} shards, vocab_size={args.vocab_size}")
    tok = train(docs, args.vocab_size, args.split_digits, args.min_frequency)
    save(tok, args.out)
    if tok.get_vocab_size() < args.vocab_size:
        print(
            f"note: vocab is {tok.get_vocab_size()}, not {args.vocab_size}: no pair of tokens occurs"
            f" {args.min_frequency}+ times any more (every word of the corpus is already one token)"
        )
    for f in sorted(args.out.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()[:12]
        print(f"  {f.name:28s} {f.stat().st_size:8d} bytes  sha256:{digest}")

    if args.verify:
        domains: dict[str, list[str]] = {}
        for d in sorted(p for p in args.corpus.iterdir() if p.is_dir()):
            for split in ("train", "validation"):
                files = sorted(d.glob(f"{split}-*.jsonl"))
                if files:
                    domains[f"{d.name}/{split}"] = read_docs(files)
        verify(args.out, domains)
    return 0


if __name__ == "__main__":
    sys.exit(main())
