"""A learned reward model's checks and how its score joins the rule reward.

`check_reward_model_path` (preflight and load): `reward.model_path` is a local one-label
`AutoModelForSequenceClassification` directory with its tokenizer, else one line naming the key;
`combine`: the model's score added to the rule reward as a weighted term. The scorer itself, a
forward like the reference model's, is `asyncrl.training.reward_model.RewardModel`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from asyncrl.errors import ConfigError
from asyncrl.rewards.registry import RewardResult

if TYPE_CHECKING:

    pass

KEY = "reward.model_path"
T = TypeVar("T")
ForwardPath = Literal["packed", "padded"]
log = logging.getLogger(__name__)


def check_reward_model_path(path: str) -> None:
    """A one-line ConfigError naming `reward.model_path` unless it is a local directory holding a
    one-label sequence classifier (config.json's architectures), a tokenizer and weights."""
    from asyncrl.models.loading import TOKENIZER_FILES, WEIGHT_PATTERNS

    where = Path(path).expanduser()
    key = f"{KEY}={path!r}"
    want = "a local AutoModelForSequenceClassification directory with num_labels=1 (save_pretrained)"
    if not where.is_dir():
        raise ConfigError(f"{key} {'is a file' if where.exists() else 'does not exist'}; set it to {want}")
    try:
        config = json.loads((where / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{key} has no readable config.json ({exc}); set it to {want}") from None
    architectures = [str(a) for a in config.get("architectures") or []]
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        kind = ", ".join(architectures) or "a model without architectures in config.json"
        raise ConfigError(f"{key} is {kind}, not a sequence classifier; set it to {want}")
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 2))  # transformers' default: 2
    if labels != 1:
        raise ConfigError(f"{key} has {labels} labels; a reward model gives one score per response: set it to {want}")
    if not any((where / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{key} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): "
                          "save the reward model's tokenizer beside it (tokenizer.save_pretrained)")
    if not any(next(where.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        raise ConfigError(f"{key} has no weights (no *.safetensors or pytorch_model*.bin); set it to {want}")


def reward_model_positions(path: str) -> int | None:
    """`max_position_embeddings` of the reward model's saved config, if it says."""
    try:
        return int(json.loads((Path(path).expanduser() / "config.json").read_text())["max_position_embeddings"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def combine(rule: RewardResult | None, model_score: float, rule_weight: float, model_weight: float) -> RewardResult:
    """The reward of one response: `rule_weight * rule + model_weight * model_score`, both parts in
    `details` ("rule", "reward_model"). No rule (weight 0: the model alone, verl's reward model
    semantics): the weighted model score. A failed rule stays failed (score 0, its status).

    Example: combine(RewardResult(1.0), 0.5, rule_weight=1.0, model_weight=2.0) scores 2.0 with
    details {"rule": 1.0, "reward_model": 0.5}.
    """
    if rule is None:
        return RewardResult(model_weight * model_score, details={"reward_model": model_score})
    if rule.status != "ok":
        return rule
    details = {**rule.details, "rule": rule.score, "reward_model": model_score}
    return dataclasses.replace(rule, score=rule_weight * rule.score + model_weight * model_score, details=details)
