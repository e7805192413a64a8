"""An expert axis that does not divide the experts."""

# expect: step 'train/tiny', field `mesh.expert`: 4 experts do not split over an expert axis of 8
# args:
from pipeline import Resources, executor_main
from steps.training.mesh import MeshSpec
from tests.steps.tiny import train

step = train(mesh=MeshSpec(expert=8), resources=Resources(gpus=8, accelerator="H100"))

if __name__ == "__main__":
    executor_main([step])
