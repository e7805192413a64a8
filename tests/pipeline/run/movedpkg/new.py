"""Where the moved names live now."""


class Config:
    pass


class Renamed:
    pass
