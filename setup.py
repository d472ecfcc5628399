"""Build of the one C extension: the L1 table (_l1table.c, which includes _resp.h, the RESP of its
plain path); everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("arca.archive._l1table", ["arca/archive/_l1table.c"],
                             depends=["arca/archive/_resp.h"],  # included by _l1table.c
                             extra_compile_args=["-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                                 "-Wno-missing-field-initializers", "-Wno-cast-function-type"])])
