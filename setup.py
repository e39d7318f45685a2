from setuptools import find_packages, setup

# `envs/` lives at the top level of the repository but installs as `ragen_turn.envs` (its subpackages follow the
# mapping), so no generic top-level name lands in site-packages.
PACKAGES = (find_packages(include=["ragen_turn", "ragen_turn.*"])
            + ["ragen_turn.envs"] + [f"ragen_turn.envs.{p}" for p in find_packages("envs")])

setup(
    name="ragen_turn",
    version="0.1.0",
    description="Turn-level RL (Turn-PPO, ST-PPO) for multi-turn LLM agents; a RAGEN-compatible reimplementation",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir={"ragen_turn.envs": "envs"},
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
        # LoRA on the actor (actor_rollout_ref.model.lora_rank > 0; ragen_turn/models/lora.py)
        "lora": ["peft>=0.17"],
        # CPU: the verl engine's tests against verl 0.9.1 (no vllm)
        "verl": ["verl==0.9.1", "cachetools", "uvicorn", "fastapi", "pyzmq", "msgspec"],
        # GPU machines: verl with vLLM rollouts
        "gpu": ["verl[vllm]==0.9.1", "cachetools", "uvicorn", "fastapi", "pyzmq", "msgspec"],
    },
)
