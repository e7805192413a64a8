"""A predicted loss from a scaling fit whose target is another model size."""

# expect: step 'train/tiny', field `prediction`: 'scaling/ladder' predicts 'd128' (N=
# args:
from pipeline import executor_main
from steps.models import tiny_moe
from steps.scaling.fit import ScalingPoint, scaling_fit_step
from steps.scaling.prediction import predicted_by
from tests.steps.tiny import train

ladder = scaling_fit_step(
    "scaling/ladder",
    points=[
        ScalingPoint(f"d{h}-{tokens}", tiny_moe(h), tokens, f"/evaluations/d{h}-{tokens}")
        for h in (16, 24, 32)
        for tokens in (20_000, 50_000)
    ],
    target=ScalingPoint("d128", tiny_moe(128), 100 * 8 * 64),
)
step = train(prediction=predicted_by(ladder))

if __name__ == "__main__":
    executor_main([step])
