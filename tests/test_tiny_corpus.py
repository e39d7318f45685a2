"""The tiny tokenizer's corpus (ragen_turn/models/tiny_corpus.py) holds copies of prompt text; these tests fail when a
copy and the real text drift apart.

The corpus is not generated from the live prompt code on purpose: any change to the corpus retrains the tiny
tokenizer, which changes every cached tiny model and warm start and every seeded number. So when a test here fails,
either update the copy in tiny_corpus.py and bump ``tiny_tokenizer.TOKENIZER_VERSION`` (accepting that), or update the
expectation below.
"""
from __future__ import annotations

import re

from helpers import micro_config, tiny_tokenizer

from ragen_turn.models.tiny_corpus import SEARCH_QA_CHAT, build_corpus
from ragen_turn.rollout import ChatFormatter, EnvGroupManager, TextPolicy, context_config, run_episodes
from ragen_turn.rollout.context import ContextConfig, system_prompt, user_message


def _search_qa_episode_text():
    """The decoded tokens of real search-QA episodes (think on): an invalid response, then the warm start's expert
    responses (a search, ..., the answer)."""
    from ragen_turn.warmstart import demo_responder

    cfg = micro_config(["env=search_qa", "agent_proxy.enable_think=true", "agent_proxy.max_turn=4",
                        "actor_rollout_ref.rollout.response_length=200", "es_manager.train.env_groups=4"])
    expert = demo_responder(cfg, 0)
    seen = set()

    def respond(slot):
        if id(slot) not in seen:
            seen.add(id(slot))
            return "hello"
        return expert(slot)

    tok = tiny_tokenizer()
    slots = EnvGroupManager(cfg.custom_envs, cfg.es_manager.train, "train").assign_seeds(0, 0)
    episodes = run_episodes(slots, TextPolicy(tok, respond), ChatFormatter(tok), context_config(cfg))
    assert any(e.success for e in episodes)  # the expert answered: the answer turn's text is in there
    return "\n".join(tok.decode(e.token_ids) for e in episodes)


def test_search_qa_chat_copies_are_the_real_prompt_text():
    text = _search_qa_episode_text()
    missing = [line for line in SEARCH_QA_CHAT if line not in text]
    assert not missing, f"tiny_corpus.SEARCH_QA_CHAT no longer matches the search-QA prompts: {missing}"


# Words of the Sokoban / WebShop prompt text (system prompts with and without the env's rules, the user message's
# frame) that the `agents` corpus never shows: the gap as it is now. The corpus was written from RAGEN's prompt
# wording, so some of ours is new to it; a prompt change that adds (or removes) such words shows up here.
KNOWN_UNSEEN = {
    "frame": {"Give", "agent", "turns"},
    "sokoban": {"Walking", "again", "ahead", "beyond", "but", "cell", "every", "floor", "if", "may", "moved",
                "never", "once", "out", "plan", "playing", "pushed", "standing", "walk"},
    "webshop": {"Select", "as", "attributes", "before", "best", "button", "buying", "clicking", "ends", "episode",
                "exactly", "features", "from", "id", "kind", "label", "limit", "link", "lists", "option",
                "purchase", "requested", "reviews", "scores", "shopping", "simulated", "store", "such", "under"},
}


def _words(text: str) -> set:
    return set(re.findall(r"[A-Za-z]+", text))


def test_agents_corpus_covers_the_sokoban_and_webshop_prompt_words():
    from ragen_turn.envs import get_env_class, make_env

    corpus = _words("\n".join(build_corpus(0)))
    frame = set()
    for think in (False, True):
        cfg = ContextConfig(enable_think=think, include_env_instruction=False)
        frame |= _words(system_prompt("", cfg) + "\n" + user_message("", 1, cfg, reward=-0.1))
    unseen = {"frame": frame - corpus}
    # WebShop's rules are a class attribute: no env is built, so no search index is left in the process cache
    instructions = {"sokoban": make_env("sokoban", {}).instruction, "webshop": get_env_class("webshop").instruction}
    for name, instruction in instructions.items():
        unseen[name] = _words(system_prompt(instruction, ContextConfig(enable_think=True))) - corpus - frame
    assert unseen == KNOWN_UNSEEN, (
        "the Sokoban / WebShop prompt words outside the tiny tokenizer's corpus changed: update KNOWN_UNSEEN, or "
        "the corpus in ragen_turn/models/tiny_corpus.py (and bump tiny_tokenizer.TOKENIZER_VERSION; see this file's "
        "docstring)")
