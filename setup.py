from setuptools import setup

# `envs/` lives at the top level of the repository but installs as `ragen_turn.envs`,
# so no generic top-level name lands in site-packages.
PACKAGES = [
    "ragen_turn",
    "ragen_turn.algos",
    "ragen_turn.rollout",
    "ragen_turn.engines",
    "ragen_turn.engines.local",
    "ragen_turn.engines.verl",
    "ragen_turn.report",
    "ragen_turn.models",
    "ragen_turn.envs",
    "ragen_turn.envs.sokoban",
    "ragen_turn.envs.webshop",
    "ragen_turn.envs.search_qa",
    "ragen_turn.envs.bandit",
    "ragen_turn.envs.frozen_lake",
    "ragen_turn.envs.countdown",
]

setup(
    name="ragen_turn",
    version="0.1.0",
    description="Turn-level RL (Turn-PPO, ST-PPO) for multi-turn LLM agents; a RAGEN-compatible reimplementation",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir={"ragen_turn.envs": "envs", "ragen_turn.envs.sokoban": "envs/sokoban",
                 "ragen_turn.envs.webshop": "envs/webshop", "ragen_turn.envs.search_qa": "envs/search_qa",
                 "ragen_turn.envs.bandit": "envs/bandit", "ragen_turn.envs.frozen_lake": "envs/frozen_lake",
                 "ragen_turn.envs.countdown": "envs/countdown"},
    package_data={"ragen_turn.envs.webshop": ["data/*.json"], "ragen_turn.envs.search_qa": ["data/*.jsonl.gz"]},
    install_requires=[
        "torch>=2.4",
        "numpy>=2",
        "transformers>=5.5.3,<5.11,!=5.6.0",
        "tokenizers",
        "safetensors",
        "hydra-core==1.3.*",
        "omegaconf",
        "gymnasium>=1.0",
    ],
    extras_require={
        "dev": ["pytest", "hypothesis", "ruff>=0.15"],
        "webshop": ["bm25s>=0.2"],
        "search_qa": ["bm25s>=0.2"],
        "parquet": ["pyarrow"],          # search_qa: Search-R1's QA parquet files
        "plot": ["matplotlib"],
        # ragen_turn.report's interval estimates (IQM, stratified bootstrap CIs, probability of improvement)
        "stats": ["scipy>=1.15"],
        "smol": ["gguf", "accelerate"],
        "wandb": ["wandb"],
        # CPU: the verl engine's tests against verl 0.9.1 (no vllm)
        "verl": ["verl==0.9.1", "cachetools", "uvicorn", "fastapi", "pyzmq", "msgspec"],
        # GPU machines: verl with vLLM rollouts
        "gpu": ["verl[vllm]==0.9.1", "cachetools", "uvicorn", "fastapi", "pyzmq", "msgspec"],
    },
)
