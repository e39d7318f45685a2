# A test env written as RAGEN's docs teach ("Adding Custom Environments": ragen/env/new_env/config.py), not RAGEN's
# code: its configuration dataclass.
from dataclasses import dataclass, field
from typing import List


@dataclass
class EchoWordEnvConfig:
    words: List[str] = field(default_factory=lambda: ["apple", "river", "stone", "cloud"])
    max_steps: int = 2
    render_mode: str = "text"
