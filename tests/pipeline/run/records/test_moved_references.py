"""References recorded by an older layout of a package are looked up in its `MOVED` table where
manifests are decoded, and nowhere else: nothing is added to the import system."""

from __future__ import annotations

import importlib

import pytest

from pipeline.run.records.recipe_codec import RecipeError, Resolver, moved_reference
from tests.pipeline.run.movedpkg.new import Config, Renamed

PKG = "tests.pipeline.run.movedpkg"


def test_a_moved_module_and_a_moved_name_resolve_to_where_they_live_now():
    resolve = Resolver(None)
    assert resolve(f"{PKG}.old:Config", "s", "config") is Config
    assert resolve(f"{PKG}.new:Gone", "s", "config") is Renamed
    assert moved_reference(f"{PKG}.old.inner:X") == f"{PKG}.new.inner:X"
    assert moved_reference(f"{PKG}.new:Config") is None  # not in the table: it did not move


def test_the_old_path_is_not_importable_as_code():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(f"{PKG}.old")


def test_what_is_in_no_table_or_loops_is_one_clear_error():
    resolve = Resolver(None)
    with pytest.raises(RecipeError, match=r"cannot import tests\.pipeline\.run\.movedpkg\.nowhere:X"):
        resolve(f"{PKG}.nowhere:X", "s", "config")
    with pytest.raises(RecipeError, match="cannot import"):
        resolve(f"{PKG}.loop_a:X", "s", "config")
    with pytest.raises(RecipeError, match="cannot import"):
        resolve("no_such_package_anywhere.x:Y", "s", "config")
