"""A package whose modules moved, as `steps` did: its `MOVED` table says where each old path lives
now (tests/pipeline/run/records/test_moved_references.py)."""

MOVED = {
    "tests.pipeline.run.movedpkg.old": "tests.pipeline.run.movedpkg.new",
    "tests.pipeline.run.movedpkg.new:Gone": "tests.pipeline.run.movedpkg.new:Renamed",
    "tests.pipeline.run.movedpkg.loop_a": "tests.pipeline.run.movedpkg.loop_b",
    "tests.pipeline.run.movedpkg.loop_b": "tests.pipeline.run.movedpkg.loop_a",
}
