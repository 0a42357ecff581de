"""The toolkit's tests (rope_bwd_triton: build, publish, demo, bench, tune, e2e, and the
kernelize flow on transformers models). They need the repository, so hub CI, which
holds only build.toml, torch-ext/ and tests/, does not collect them (tests/conftest.py);
none is marked kernels_ci. The package fixtures (kernel, gen) come from tests/conftest.py."""
