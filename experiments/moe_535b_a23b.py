"""The hero recipe: a 535B-total / 23B-active MoE pretrained on 18T tokens, declared faithfully.

    drydock plan experiments/moe_535b_a23b.py            # every step, identity and resources;
                                                         # parameters, tokens and steps of training
    DRYDOCK_535B_DATA=gs://bucket/raw drydock run experiments/moe_535b_a23b.py --ray_address HOST:6379

Downstream tasks: the usual base-model set (HellaSwag, ARC easy/challenge, PIQA, WinoGrande, BoolQ,
OpenBookQA, CommonsenseQA, MMLU) as lm-eval registry names with their customary few-shot counts,
run on the final checkpoint. Their rows are read offline from DRYDOCK_535B_TASK_DATA
(`<task>/<split>.jsonl`, e.g. exported once from the Hub on a machine that can reach it).

The published run (535.3B total / 22.76B active): hidden 6144, 48 layers, 48 heads of 128 with 12
KV heads on local layers and 6 on global ones (every 4th), sliding window 2048 on local layers;
384 routed experts of width 3072, top-8, plus 2 shared experts of width 3072; no auxiliary loss;
z-loss 1e-4; vocabulary 128,256; sequence 4,096; batch 11,264; 390,251 steps (18.0T tokens);
data switching at step 108,000 and cooldown weights from step 312,192; linear decay to 0.05 of
the peak after about 1% warm-up; GB200 GPU racks.

This declaration, in Drydock's own MoE family (`steps.models.drydock_moe`, built for this architecture:
Levanter's Qwen3-MoE has no shared experts, no working sliding window and one KV-head count):
hidden 6144, 48 layers, 48 query heads of 128 with QK norm; local layers see a window of 2,048
tokens with 12 KV heads, every 4th layer is global with 6; 384 routed experts, top-8, and 2 shared
experts that every token uses; auxiliary-loss-free balancing (a per-expert router bias moved
toward balance every step, DeepSeek-V3's method); vocabulary 128,256, z-loss 1e-4, 390,251 steps
of 11,264 x 4,096 tokens (18,005,144,633,344 tokens), phases from steps 0, 108,000 and 312,192,
AdamW with linear decay to 0.05 of the peak after 1% warm-up (about 3,900 steps).
`parameter_counts`, read from the model's own shapes, gives 535.08B total (-0.04%) and 22.78B
active (+0.10%).

How the published widths are read. With SwiGLU's three matrices, 384 experts of width 3072 in
48 layers would hold 1,043B parameters, twice the published total: the routed "3072" is the fused
gate-and-up width, 1,536 per matrix. Read so, with the shared experts at 3,072 per matrix, the
model holds 533.38B / 22.41B (-0.36% / -1.52%): no reading of the published widths gives both
published totals with this attention. Solving the two totals for the two widths gives 1,541 and
3,244; the declaration takes the nearest widths the hardware likes, routed 1,540 (a multiple of 4)
and shared 3,264 (a multiple of 64).

Every remaining difference from the published run:
  * the data components and their weights are placeholders with the original's structure: three
    phases, switching at the published steps. Each is a raw dataset declared by name and version
    (`steps.data.sources.raw_dataset`) at two mirror locations, DRYDOCK_535B_DATA and
    DRYDOCK_535B_DATA_MIRROR; moving the data between them keeps every identity;
  * the web component starts as crawl (WARC files, `web/crawl/`): its text is extracted, English
    kept, the Gopher, C4 and FineWeb rules applied, and a quality classifier (trained as a step
    from a curated positive set and a random crawl sample) filters it, every removal with its
    evidence (docs/data.md, "From web crawl"); the other components are text already;
  * each component's training files are deduplicated and decontaminated before tokenizing, as
    steps of their own. Dedupe's global pass is sharded: 10 LSH passes (9 bands and the exact one)
    of 64 parts each, as Ray tasks across the cluster; `drydock plan` states each task's memory
    for the component's size (`DOCUMENTS`: 2.3 GiB a band part for the web's 10 billion);
  * the peak learning rate (2e-4) and weight decay (0.1) are not published; they are this
    recipe's choice. The balancing bias moves by about the learning rate each step (AdamW on the
    load imbalance), not by DeepSeek-V3's fixed 0.001.

Hardware, as published: 704 GB200 GPUs, 11 racks of 16 hosts with 4 GPUs each, as one gang of
176 hosts (`Resources(gpus=4, hosts=176, accelerator="GB200")`: one process per host, all hosts
reserved at once, the whole gang retried from its last checkpoint when a host is lost). The mesh
puts the batch on all 704 GPUs (11,264 sequences: 16 per GPU) and shards the parameters FSDP-style
over 88 of them and the experts 8 ways (`MeshSpec(data=88, expert=8)`: 48 of the 384 experts' weights per
device), computing in bfloat16. `drydock plan` shows, offline:

    mesh               data 88 x expert 8 (704 GB200)
    memory per device  117.2 GiB of 173.2 GiB (68%): state 13.1 GiB, activations 104.1 GiB
    time               40 days at 40% MFU

Compiled for its hardware (`DRYDOCK_535B_HARDWARE=v5p drydock plan ... --compile`: one v5p-2048
slice, `MeshSpec(data=128, expert=8)`), XLA refuses it in 74 s on a 2-core host: 27.87 TiB of
temporaries per chip against the estimate's 80.6 GiB: at 1,024 chips part of the program is not
split by the batch (per-chip temporaries grow with the global batch, about the whole batch's
logits), and every chip gathers all 384 experts of the layer it computes (docs/training.md, "The
hero on its hardware, compiled"): neither layout trains as declared until both are fixed.

(memory: 16 bytes per parameter held, the residual stream of each of the 48 layers, one layer's
working set, the float32 logits: `steps/training/estimates.py`; time: 6 x 22.70B active parameters x 18.0T
tokens / (704 x 2.5 PFLOP/s x 0.4)). The published run took about three months, an MFU nearer 0.15.

Tokenization runs on CPU hosts.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from pipeline import Resources, Step, executor_main
from steps.data.decontaminate import decontaminate_step
from steps.data.dedupe import dedupe_step
from steps.data.extract import extract_step
from steps.data.heuristics import heuristics_step
from steps.data.language import language_step
from steps.data.mixture import mixture_step
from steps.data.quality import quality_classifier_step, quality_filter_step
from steps.data.sources import RawDataset, raw_dataset
from steps.data.tokenize import tokenize_step
from steps.evaluation.evaluate import evaluate_step
from steps.evaluation.task_eval import task_eval_step
from steps.models import MoeModelConfig
from steps.scaling.fit import ScalingPoint, scaling_fit_step, scaling_point
from steps.scaling.prediction import predicted_by
from steps.training.spikes import Stability
from steps.training.train_moe import MeshSpec, OptimizerSpec, train_moe_step

DATA = os.environ.get("DRYDOCK_535B_DATA", "gs://your-bucket/raw")
DATA_MIRROR = os.environ.get("DRYDOCK_535B_DATA_MIRROR", "gs://your-bucket-eu/raw")
DATA_REGIONS = ("us-central1", "europe-west4")  # where DATA and DATA_MIRROR are; hosts set DRYDOCK_REGION
DATA_VERSION = "2026-11"  # the raw data's release: bump it when the files are replaced
TOKENIZER = os.environ.get("DRYDOCK_535B_TOKENIZER", "meta-llama/Meta-Llama-3.1-8B")
TASK_DATA = os.environ.get("DRYDOCK_535B_TASK_DATA", "gs://your-bucket/eval-tasks")
VOCAB_SIZE = 128_256
BATCH_SIZE = 11_264
SEQ_LEN = 4_096
NUM_STEPS = 390_251  # as published: 18.0T tokens
TRAIN_TOKENS = NUM_STEPS * BATCH_SIZE * SEQ_LEN  # 18,005,144,633,344
MAIN_FROM = 108_000  # the published data switch
COOLDOWN_FROM = 312_192  # the published start of the cooldown mixture

CPU_HOST = Resources(cpus=32, memory="128GiB")

COMPONENTS = {
    # name: (train glob, validation glob), under DATA; the web's training text is made from crawl
    "web": ("web/crawl/*.warc.gz", "web/validation/*.jsonl.zst"),
    "code": ("code/train/*.jsonl.zst", "code/validation/*.jsonl.zst"),
    "math": ("math/train/*.jsonl.zst", "math/validation/*.jsonl.zst"),
    "books": ("books/train/*.jsonl.zst", "books/validation/*.jsonl.zst"),
    "instruction": ("instruction/train/*.jsonl.zst", "instruction/validation/*.jsonl.zst"),
}


DOCUMENTS = {
    "web": 10_000_000_000,
    "code": 3_000_000_000,
    "math": 2_000_000_000,
    "books": 20_000_000,
    "instruction": 500_000_000,
}
"""Documents per component, for the plan's dedupe memory figures: placeholders like the components,
of the right order (the tokens each supplies at the weights below, about 1,000 tokens a document;
books 100,000)."""


def raw(name: str, pattern: str) -> RawDataset:
    """A raw dataset by name and version, at two mirror locations (two regions): a step reads the
    one in its host's region (DRYDOCK_REGION), and its identity, and so every identity downstream,
    is the same whichever location it reads from."""
    urls = {DATA_REGIONS[0]: f"{DATA}/{pattern}", DATA_REGIONS[1]: f"{DATA_MIRROR}/{pattern}"}
    return raw_dataset(name, version=DATA_VERSION, urls=urls)


VALIDATION = {
    name: raw(f"{name}-validation", validation) for name, (_train, validation) in COMPONENTS.items()
}


QUALITY_SETS = {"positive": "quality/positive/*.jsonl.zst", "negative": "quality/negative/*.jsonl.zst"}
"""The quality classifier's examples: curated text to keep (reference pages, books, papers) and a
random sample of the crawl's extracted text, as DCLM trains its filter."""


def web_documents(pattern: str) -> Step:
    """The web component's documents from crawl: text extracted from the WARC files, English kept,
    the published heuristic rules applied, then the quality classifier's filter."""
    pages = extract_step(
        "extract/web", inputs=[raw("web-crawl", pattern)], num_workers=64, resources=CPU_HOST
    )
    english = language_step(
        "language/web", inputs=[pages / "data"], languages=["en"], num_workers=64, resources=CPU_HOST
    )
    clean = heuristics_step("heuristics/web", inputs=[english / "data"], num_workers=64, resources=CPU_HOST)
    classifier = quality_classifier_step(
        "quality/classifier",
        positive=[raw("quality-positive", QUALITY_SETS["positive"])],
        negative=[raw("quality-negative", QUALITY_SETS["negative"])],
        max_documents=500_000,
        resources=CPU_HOST,
    )
    return quality_filter_step(
        "quality/web", inputs=[clean / "data"], classifier=classifier, num_workers=64, resources=CPU_HOST
    )


def curated(name: str, pattern: str) -> Step:
    """A component's training files, deduplicated (exact and MinHash LSH) and then decontaminated
    against every validation set and the downstream tasks' rows (13-grams). The web's are made
    from crawl first (`web_documents`)."""
    documents = web_documents(pattern) / "data" if name == "web" else raw(f"{name}-train", pattern)
    deduped = dedupe_step(
        f"dedupe/{name}",
        inputs=[documents],
        num_workers=64,
        band_parts=64,
        documents=DOCUMENTS[name],
        resources=CPU_HOST,
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
    family="drydock_moe",
    hidden_dim=6144,
    expert_intermediate_dim=1540,  # the published 3072 is the fused gate+up width; see above
    num_layers=48,
    num_heads=48,
    num_kv_heads=12,  # local layers
    num_global_kv_heads=6,
    global_every=4,
    sliding_window=2048,
    head_dim=128,
    num_experts=384,
    num_experts_per_token=8,
    num_shared_experts=2,
    shared_expert_intermediate_dim=3264,
    balancing="bias",
    router_z_loss_coef=None,  # no auxiliary loss at all: the published z-loss is the LM head's
    qk_norm=True,
    rope_theta=500_000.0,
)

OPTIMIZER = OptimizerSpec(
    name="adamw",
    learning_rate=2e-4,
    weight_decay=0.1,
    warmup=0.01,
    min_lr_ratio=0.05,
    lr_schedule="linear",
)
HARDWARE = os.environ.get("DRYDOCK_535B_HARDWARE", "gb200")
"""Where the hero trains: "gb200", as published (704 GB200 GPUs), or "v5p", a v5p-2048 slice (1,024
chips). Resources and the mesh are not part of an identity: both are the same training."""
LAYOUTS = {
    # 176 hosts of 4 GPUs; the batch over all 704, parameters FSDP over 88, experts 8 ways.
    "gb200": (
        Resources(gpus=4, hosts=176, accelerator="GB200", cpus=32, preemption_retries=1_000),
        MeshSpec(data=88, expert=8),
    ),
    # One v5p-2048 slice (256 hosts of 4 chips): the batch over all 1,024 chips (11 sequences each),
    # parameters FSDP over 128, experts 8 ways (48 per chip).
    "v5p": (Resources(tpu="v5p-2048", cpus=32, preemption_retries=1_000), MeshSpec(data=128, expert=8)),
}
if HARDWARE not in LAYOUTS:
    raise SystemExit(f"DRYDOCK_535B_HARDWARE={HARDWARE!r}: use one of {', '.join(LAYOUTS)}")
GANG, LAYOUT = LAYOUTS[HARDWARE]

# -- the scaling ladder: the prediction the run is watched against --------------------------------

LADDER_SIZES = ((1024, 8), (1536, 12), (2048, 16), (2560, 20), (3072, 24))
"""(hidden, layers) of the ladder's models: the hero's architecture at five sizes, 1/6 to 1/2 of its
width, with whole blocks of three local layers and a global one."""
LADDER_STEPS = (1_000, 2_000, 4_000)
"""Their budgets at the hero's batch: 46B, 92B and 185B tokens. Every ladder run reads the mixture's
first phase only (it switches at step 108,000)."""


def ladder_model(hidden_dim: int, num_layers: int, base: MoeModelConfig = model) -> MoeModelConfig:
    """`base` (the hero's model) at width `hidden_dim` and depth `num_layers`: the same routed
    experts and top-k routing, the same shared experts, heads of base's width with 4 query heads per
    local KV head and 8 per global one (at least one of each), the same window and block of local
    layers and a global one, expert widths in the hero's proportions to the hidden size (a quarter,
    and about a half for the shared ones), QK norm, RoPE, balancing bias and vocabulary."""
    heads = hidden_dim // base.actual_head_dim
    return dataclasses.replace(
        base,
        hidden_dim=hidden_dim,
        num_layers=num_layers,
        num_heads=heads,
        num_kv_heads=max(1, heads // 4),
        num_global_kv_heads=max(1, heads // 8),
        expert_intermediate_dim=hidden_dim // 4,
        shared_expert_intermediate_dim=hidden_dim // 2,
    )


def ladder(
    name: str,
    target: MoeModelConfig,
    target_tokens: int,
    *,
    target_label: str,
    data: Step,
    sizes: Sequence[tuple[int, int]],
    steps: Sequence[int],
    batch_size: int,
    seq_len: int,
    optimizer: OptimizerSpec,
    train_options: Mapping[str, Any],
    eval_options: Mapping[str, Any],
) -> Step:
    """The scaling fit of a ladder: `target`'s architecture at every (hidden, layers) in `sizes`,
    each trained for every budget in `steps` on `data` and evaluated, the fit predicting `target`
    at `target_tokens` (its point labelled `target_label`). Rungs are `train/<name>/d{H}-s{S}`
    and `evaluate/<name>/d{H}-s{S}`; every rung's training gets `train_options`, its evaluation
    `eval_options`."""

    def point(hidden_dim: int, num_layers: int, num_steps: int) -> ScalingPoint:
        label = f"d{hidden_dim}-s{num_steps}"
        rung = train_moe_step(
            f"train/{name}/{label}",
            data=data,
            model=ladder_model(hidden_dim, num_layers, target),
            optimizer=optimizer,
            batch_size=batch_size,
            seq_len=seq_len,
            num_steps=num_steps,
            checkpoint_interval=num_steps,  # the final checkpoint, for its evaluation
            eval_interval=num_steps,
            hf_export=False,
            **train_options,
        )
        scored = evaluate_step(
            f"evaluate/{name}/{label}", train=rung, data=data, seq_len=seq_len, **eval_options
        )
        return scaling_point(rung, scored, label=label)

    return scaling_fit_step(
        f"scaling/{name}",
        points=[point(h, layers, s) for h, layers in sizes for s in steps],
        target=ScalingPoint(label=target_label, model=target, tokens=target_tokens),
    )


ladder_fit = ladder(
    "535b-ladder",
    model,
    TRAIN_TOKENS,
    target_label="moe-535b-a23b",
    data=mixture,
    sizes=LADDER_SIZES,
    steps=LADDER_STEPS,
    batch_size=BATCH_SIZE,
    seq_len=SEQ_LEN,
    optimizer=OPTIMIZER,
    train_options={
        "stability": Stability(z_loss=1e-4),
        "vocab_size": VOCAB_SIZE,
        "mesh": LAYOUT,
        "precision": "bf16",
        "resources": GANG,
    },
    eval_options={"batch_size": 512, "resources": Resources(tpu="v5p-256")},
)

train = train_moe_step(
    "train/moe-535b-a23b",
    data=mixture,
    model=model,
    optimizer=OPTIMIZER,
    stability=Stability(z_loss=1e-4),
    batch_size=BATCH_SIZE,
    seq_len=SEQ_LEN,
    num_steps=NUM_STEPS,
    vocab_size=VOCAB_SIZE,
    checkpoint_interval=5_000,
    checkpoint_minutes=30,
    eval_interval=5_000,
    mesh=LAYOUT,
    precision="bf16",
    resources=GANG,
    # Waits for the ladder's fit; outside the training's identity (refitting never reruns it).
    prediction=predicted_by(ladder_fit),
)

evaluation = evaluate_step(
    "evaluate/moe-535b-a23b",
    train=train,
    data=mixture,
    seq_len=SEQ_LEN,
    batch_size=512,
    resources=Resources(tpu="v5p-256"),
)

# -- the same ladder and training, scaled down to run on a CPU -------------------------------------


def scaled_down(
    data: Step,
    *,
    batch_size: int = 4,
    seq_len: int = 64,
    sizes: Sequence[tuple[int, int]] = ((16, 4), (24, 4), (32, 4)),
    steps: Sequence[int] = (12, 24),
    target: tuple[int, int, int] = (48, 4, 48),
) -> list[Step]:
    """The hero's ladder and training at toy scale on `data` (the demo corpus in the tests): the
    same code declares the rungs (`ladder`, `ladder_model`), the fit and a training fed its predicted
    curve, in the hero's architecture with what a CPU can hold changed: heads of 8, 8 routed experts
    with top-2 (2 shared), a window of 16 tokens, one block of three local layers and a global one.
    `target` is (hidden, layers, steps) of the tiny "hero"; the optimizer is the hero's (linear decay
    to 0.05 of the peak) at a toy model's rate. Returns the tiny hero's evaluation (every other
    step hangs off it)."""
    base = dataclasses.replace(
        model, head_dim=8, num_experts=8, num_experts_per_token=2, sliding_window=16, rope_theta=10_000.0
    )
    hidden, layers, num_steps = target
    tiny = ladder_model(hidden, layers, base)
    optimizer = dataclasses.replace(OPTIMIZER, learning_rate=3e-3, warmup=0.1)
    options: dict[str, Any] = {"stability": Stability(z_loss=1e-4), "resources": Resources(cpus=1)}
    fit = ladder(
        "tiny-ladder",
        tiny,
        num_steps * batch_size * seq_len,
        target_label="tiny-hero",
        data=data,
        sizes=sizes,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        optimizer=optimizer,
        train_options=options,
        eval_options={"batch_size": batch_size},
    )
    hero = train_moe_step(
        "train/tiny-hero",
        data=data,
        model=tiny,
        optimizer=optimizer,
        batch_size=batch_size,
        seq_len=seq_len,
        num_steps=num_steps,
        checkpoint_interval=num_steps,
        eval_interval=max(1, num_steps // 4),  # four evaluations placed on the predicted curve
        hf_export=False,
        prediction=predicted_by(fit),
        **options,
    )
    return [
        evaluate_step("evaluate/tiny-hero", train=hero, data=data, seq_len=seq_len, batch_size=batch_size)
    ]


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
