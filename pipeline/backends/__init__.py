"""Backends run step functions; see `base.Backend`. Each backend module imports its own
heavy dependencies (Ray), so importing this package stays cheap."""
