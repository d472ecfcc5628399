"""Build of the one C extension (the L1 table); everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("arca.archive._l1table", ["arca/archive/_l1table.c"],
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers", "-Wno-cast-function-type"])])
