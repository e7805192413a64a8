"""The default experiment: curate a two-domain corpus, tokenize it, mix it, train a tiny MoE,
evaluate it.

    dedupe/demo                             exact and near duplicates (MinHash LSH) removed from
                                            the committed demo corpus's training files (data/corpus)
    decontaminate/demo                      training documents sharing a 13-gram with the demo
                                            task suite's test rows removed
    tokenized/prose, tokenized/arithmetic   the curated training files and the validation files,
                                            with the committed BPE tokenizer
    mixture/tiny                            two phases: an even mix, then mostly prose
    train/tiny-qwen3-moe                    a Qwen3-MoE: 2 layers, d=64, 4 experts, top-2
    evaluate/tiny-qwen3-moe                 loss and bits-per-byte per validation set
    tasks/tiny-qwen3-moe                    lm-eval-harness on the demo task suite (data/tasks):
                                            the right sum, the true next sentence; chance 1/4

Runs on a laptop CPU in a few minutes (`make run`); a second run finds everything cached.

`DRYDOCK_TINY_HOSTS=2` declares the training as a gang of two hosts (one JAX process each, every
option on its defaults); resources are not part of an identity, so it is the same training, and
on a cluster (docs/cluster.md) it trains the same model across two hosts.
"""

from __future__ import annotations

import os

from pipeline import Resources, executor_main
from steps.data.decontaminate import decontaminate_step
from steps.data.dedupe import dedupe_step
from steps.data.mixture import mixture_step
from steps.data.tokenize import tokenize_step
from steps.evaluation.demo_tasks import DEMO_TASKS
from steps.evaluation.evaluate import evaluate_step
from steps.evaluation.task_eval import task_eval_step
from steps.models import TINY_MOE
from steps.training.train_moe import OptimizerSpec, train_moe_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOKENIZER = "data/tokenizer"
BATCH_SIZE = 8
SEQ_LEN = 128
NUM_STEPS = 320
HOSTS = int(os.environ.get("DRYDOCK_TINY_HOSTS", "1"))


DOMAINS = ("prose", "arithmetic")

# Curation before tokenizing, over both domains at once (duplicates across them count too).
deduped = dedupe_step(
    "dedupe/demo", inputs=[f"corpus/{domain}/train-*.jsonl" for domain in DOMAINS], input_root=f"{ROOT}/data"
)
# Against the downstream tasks. Not against the validation files: the demo corpus is generated
# from sentence templates, so its splits share 13-grams by construction (docs/data.md).
decontaminated = decontaminate_step(
    "decontaminate/demo", inputs=[deduped / "data"], tasks=DEMO_TASKS, input_root=ROOT
)


def tokenized(domain: str):
    return tokenize_step(
        f"tokenized/{domain}",
        train=[decontaminated / f"data/corpus/{domain}"],
        validation=[f"data/corpus/{domain}/validation-*.jsonl"],
        tokenizer=TOKENIZER,
        input_root=ROOT,
    )


prose = tokenized("prose")
arithmetic = tokenized("arithmetic")

mixture = mixture_step(
    "mixture/tiny",
    components={"prose": prose, "arithmetic": arithmetic},
    weights=[
        (0, {"prose": 0.5, "arithmetic": 0.5}),  # an even start
        (192, {"prose": 0.8, "arithmetic": 0.2}),  # then mostly prose
    ],
    target_tokens=NUM_STEPS * BATCH_SIZE * SEQ_LEN,
    batch_size=BATCH_SIZE,
    seq_len=SEQ_LEN,
    validation=["prose", "arithmetic"],
    max_epochs=2,
)

model = TINY_MOE  # a 2-layer Qwen3-MoE of width 64: 4 experts, top-2 (steps/models/config.py)

train = train_moe_step(
    "train/tiny-qwen3-moe",
    data=mixture,
    model=model,
    optimizer=OptimizerSpec(name="adamw", learning_rate=3e-3, warmup=0.05),
    batch_size=BATCH_SIZE,
    seq_len=SEQ_LEN,
    num_steps=NUM_STEPS,
    checkpoint_interval=100,
    eval_interval=80,
    resources=Resources(cpus=1, hosts=HOSTS),
)

evaluation = evaluate_step(
    "evaluate/tiny-qwen3-moe", train=train, data=mixture, seq_len=SEQ_LEN, batch_size=BATCH_SIZE
)

tasks = task_eval_step("tasks/tiny-qwen3-moe", train=train, tasks=DEMO_TASKS, data_root=ROOT)

if __name__ == "__main__":
    executor_main([evaluation, tasks], description="tiny MoE: tokenize, mix, train, evaluate")
