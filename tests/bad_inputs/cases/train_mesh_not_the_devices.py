"""A training mesh whose axes do not multiply to the devices its resources ask for."""

# expect: field `mesh`: data 4 x replica 1 x tensor 2 x expert 1 = 8 devices, but the training has 16
# args:
from pipeline import Resources, executor_main
from steps.training.mesh import MeshSpec
from tests.steps.tiny import train

step = train(mesh=MeshSpec(data=4, tensor=2), resources=Resources(gpus=8, hosts=2, accelerator="H100"))

if __name__ == "__main__":
    executor_main([step])
