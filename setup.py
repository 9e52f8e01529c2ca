"""Only the optional C decoder lives here; everything else is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "epochguard.consumer._crecords",
            sources=["src/epochguard/consumer/_crecords.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=implicit"],
            # Without a compiler the install still succeeds; the pure-Python decoder is used.
            optional=True,
        )
    ]
)
