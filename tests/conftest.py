"""Shared test setup: no test writes outside its tmp_path, and Ray never writes ~/.ray."""

import os

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
