"""The hero recipe: a 535B-total / 23B-active MoE pretrained on 18T tokens, declared faithfully.

    drydock plan experiments/moe_535b_a23b.py            # every step, identity and resources;
                                                         # parameters, tokens and steps of training
    DRYDOCK_535B_DATA=gs://bucket/raw drydock run experiments/moe_535b_a23b.py --ray_address HOST:6379

Downstream tasks: the usual base-model set (HellaSwag, ARC easy/challenge, PIQA, WinoGrande, BoolQ,
OpenBookQA, CommonsenseQA, MMLU) as lm-eval registry names with their customary few-shot counts,
run on the final checkpoint. Their rows are read offline from DRYDOCK_535B_TASK_DATA
(`<task>/<split>.jsonl`, e.g. exported once from the Hub on a machine that can reach it).

The model, in Levanter's Qwen3-MoE: hidden 6144, 48 layers, 48 query heads of 128 and 8 KV heads
(grouped-query attention), QK norm, 248 fine-grained experts of width 2432 with top-8 routing,
vocabulary 128,256 (the Llama 3 tokenizer). `parameter_counts` gives 539.5B total (+0.8%) and
23.09B active (+0.4%).

Differences from the original run, which this declaration cannot reproduce exactly:
  * no shared expert: Levanter's Qwen3-MoE has none (its Mixtral allows one, but no QK norm, and
    QK norm is what kept the 32B run free of loss spikes); the active budget goes to top-8 routing;
  * the expert count (248) and width (2432) are chosen to hit the published totals under that
    constraint, not copied from the original;
  * no auxiliary load-balancing loss (Levanter's Qwen3-MoE applies none); router balance is
    watched through the train step's router statistics instead;
  * the data components and their weights are placeholders with the original's structure
    (three phases: initial, main from 28%, cooldown from 80%). Each is a raw dataset declared by
    name and version (`steps.sources.raw_dataset`) at two mirror locations, DRYDOCK_535B_DATA and
    DRYDOCK_535B_DATA_MIRROR: moving the data between them keeps every identity;
  * each component's training files are deduplicated and decontaminated before tokenizing, as
    steps of their own. The dedupe step's global pass holds every document's MinHash signature in
    one process (512 bytes per document): at this scale (billions of documents per component) it
    needs the LSH bands sharded across hosts, which the step does not do yet.

The run: 18T tokens at a global batch of 11,264 x 4,096 tokens = 390,140 steps, on two v5p-2048
slices; tokenization on CPU hosts.
"""

from __future__ import annotations

import math
import os

from pipeline import Resources, Step, executor_main
from steps.decontaminate import decontaminate_step
from steps.dedupe import dedupe_step
from steps.evaluate import evaluate_step
from steps.mixture import mixture_step
from steps.moe import MoeModelConfig
from steps.sources import RawDataset, raw_dataset
from steps.task_eval import task_eval_step
from steps.tokenize import tokenize_step
from steps.train_moe import OptimizerSpec, train_moe_step

DATA = os.environ.get("DRYDOCK_535B_DATA", "gs://your-bucket/raw")
DATA_MIRROR = os.environ.get("DRYDOCK_535B_DATA_MIRROR", "gs://your-bucket-eu/raw")
DATA_REGIONS = ("us-central1", "europe-west4")  # where DATA and DATA_MIRROR are; hosts set DRYDOCK_REGION
DATA_VERSION = "2026-11"  # the raw data's release: bump it when the files are replaced
TOKENIZER = os.environ.get("DRYDOCK_535B_TOKENIZER", "meta-llama/Meta-Llama-3.1-8B")
TASK_DATA = os.environ.get("DRYDOCK_535B_TASK_DATA", "gs://your-bucket/eval-tasks")
VOCAB_SIZE = 128_256
TRAIN_TOKENS = 18 * 10**12
BATCH_SIZE = 11_264
SEQ_LEN = 4_096
NUM_STEPS = math.ceil(TRAIN_TOKENS / (BATCH_SIZE * SEQ_LEN))  # 390,140
MAIN_FROM = round(0.28 * NUM_STEPS)
COOLDOWN_FROM = round(0.80 * NUM_STEPS)

CPU_HOST = Resources(cpus=32, memory="128GiB")

COMPONENTS = {
    # name: (train glob, validation glob), under DATA
    "web": ("web/train/*.jsonl.zst", "web/validation/*.jsonl.zst"),
    "code": ("code/train/*.jsonl.zst", "code/validation/*.jsonl.zst"),
    "math": ("math/train/*.jsonl.zst", "math/validation/*.jsonl.zst"),
    "books": ("books/train/*.jsonl.zst", "books/validation/*.jsonl.zst"),
    "instruction": ("instruction/train/*.jsonl.zst", "instruction/validation/*.jsonl.zst"),
}


def raw(name: str, pattern: str) -> RawDataset:
    """A raw dataset by name and version, at two mirror locations (two regions): a step reads the
    one in its host's region (DRYDOCK_REGION), and its identity, and so every identity downstream,
    is the same whichever location it reads from."""
    urls = {DATA_REGIONS[0]: f"{DATA}/{pattern}", DATA_REGIONS[1]: f"{DATA_MIRROR}/{pattern}"}
    return raw_dataset(name, version=DATA_VERSION, urls=urls)


VALIDATION = {
    name: raw(f"{name}-validation", validation) for name, (_train, validation) in COMPONENTS.items()
}


def curated(name: str, pattern: str) -> Step:
    """A component's training files, deduplicated (exact and MinHash LSH) and then decontaminated
    against every validation set and the downstream tasks' rows (13-grams)."""
    deduped = dedupe_step(
        f"dedupe/{name}", inputs=[raw(f"{name}-train", pattern)], num_workers=64, resources=CPU_HOST
    )
    return decontaminate_step(
        f"decontaminate/{name}",
        inputs=[deduped / "data"],
        evaluation=[*VALIDATION.values(), f"{TASK_DATA}/*/*.jsonl"],
        num_workers=64,
        resources=CPU_HOST,
    )


tokenized = {
    name: tokenize_step(
        f"tokenized/{name}",
        train=[curated(name, train) / "data"],
        validation=[VALIDATION[name]],
        tokenizer=TOKENIZER,
        num_workers=64,
        resources=CPU_HOST,
    )
    for name, (train, validation) in COMPONENTS.items()
}

mixture = mixture_step(
    "mixture/535b-a23b",
    components=tokenized,
    weights=[
        (0, {"web": 0.70, "code": 0.15, "math": 0.05, "books": 0.10}),  # initial
        (MAIN_FROM, {"web": 0.60, "code": 0.20, "math": 0.10, "books": 0.10}),  # main
        (
            COOLDOWN_FROM,
            {"web": 0.35, "code": 0.20, "math": 0.20, "books": 0.10, "instruction": 0.15},
        ),  # cooldown
    ],
    target_tokens=TRAIN_TOKENS,
    batch_size=BATCH_SIZE,
    seq_len=SEQ_LEN,
    validation=list(COMPONENTS),
    max_epochs=4,
)

model = MoeModelConfig(
    family="qwen3_moe",
    hidden_dim=6144,
    expert_intermediate_dim=2432,
    num_layers=48,
    num_heads=48,
    num_kv_heads=8,
    head_dim=128,
    num_experts=248,
    num_experts_per_token=8,
    qk_norm=True,
    rope_theta=500_000.0,
)

train = train_moe_step(
    "train/moe-535b-a23b",
    data=mixture,
    model=model,
    optimizer=OptimizerSpec(
        name="adamw", learning_rate=2e-4, weight_decay=0.1, warmup=2000, min_lr_ratio=0.1
    ),
    batch_size=BATCH_SIZE,
    seq_len=SEQ_LEN,
    num_steps=NUM_STEPS,
    vocab_size=VOCAB_SIZE,
    checkpoint_interval=5_000,
    checkpoint_minutes=30,
    eval_interval=5_000,
    resources=Resources(tpu="v5p-2048", slices=2, cpus=8, preemption_retries=1_000),
)

evaluation = evaluate_step(
    "evaluate/moe-535b-a23b",
    train=train,
    data=mixture,
    seq_len=SEQ_LEN,
    batch_size=512,
    resources=Resources(tpu="v5p-256"),
)

# The standard base-model evaluations, "name:shots" (lm-eval registry names).
BASE_MODEL_TASKS = [
    "hellaswag:10",
    "arc_easy:25",
    "arc_challenge:25",
    "piqa:0",
    "winogrande:5",
    "boolq:0",
    "openbookqa:0",
    "commonsense_qa:7",
    "mmlu:5",
]

tasks = task_eval_step(
    "tasks/moe-535b-a23b",
    train=train,
    tasks=BASE_MODEL_TASKS,
    task_data=TASK_DATA,
    batch_size=512,
    resources=Resources(tpu="v5p-256"),
)

if __name__ == "__main__":
    executor_main([evaluation, tasks], description="535B-total / 23B-active MoE on 18T tokens")
