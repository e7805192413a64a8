"""A grouping of duplicates the dedupe step does not have."""

# expect: field `grouping`: grouping must be one of components, first_match, got 'union_find'
# args:
from pipeline import executor_main
from steps.data.dedupe import dedupe_step

step = dedupe_step("dedupe/web", inputs=["web/*.jsonl"], grouping="union_find")

if __name__ == "__main__":
    executor_main([step])
