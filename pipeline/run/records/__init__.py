"""What a run records and reads back: the manifest (`manifest_builder`) and the recipes in it
(`recipe`, `recipe_codec`), each step's provenance (`provenance`), the listings of the inputs a
cached step read (`listing`), and what a step function's hooks say of it (`hooks`: previews,
reports, metrics, warnings)."""
