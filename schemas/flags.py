"""Command-line flags generated from a settings model: one per field, with the field's
type, true default and description, spelled the way every kascade command spells them.
A secret is never a flag: it is hidden and refused in one line if given.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from enum import Enum
from typing import TypeVar, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, CliSettingsSource

from kascade.schemas.kafka import is_secret

S = TypeVar("S", bound=BaseSettings)


def flags_for(model: type[S], parser: argparse.ArgumentParser) -> CliSettingsSource[S]:
    """One flag per field of the settings class ``model`` on ``parser``, spelled the way
    every kascade command spells them (kebab case, dotted sections, ``--no-`` for off)."""
    source: CliSettingsSource[S] = CliSettingsSource(
        model,
        root_parser=parser,
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
        cli_hide_none_type=True,
        cli_use_class_docs_for_groups=True,
    )
    for action in parser._actions:
        field = _field_at(model, action.dest)
        if field is None:
            continue
        if action.help == argparse.SUPPRESS:  # a secret: hidden, and refused if given
            action.type = _refuse_secret(action.dest)
            continue
        action.help, metavar = describe_flag(field)
        action.metavar = metavar or action.metavar
        if action.dest == "kafka.extra":
            action.type = _no_secret_properties
    return source


def _refuse_secret(dest: str) -> Callable[[str], str]:
    variable = "KASCADE_" + dest.upper().replace(".", "__")

    def refuse(_value: str) -> str:
        raise argparse.ArgumentTypeError(
            f"a secret is not a flag (every user of the host can read argv): set {variable}"
            " or put it in the --config file"
        )

    return refuse


def _no_secret_properties(text: str) -> str:
    """``KEY=VALUE,...`` for ``--kafka.extra``, refused when a key holds a secret."""
    for pair in text.split(","):
        key = pair.partition("=")[0].strip()
        if is_secret(key):
            raise argparse.ArgumentTypeError(
                f"{key} holds a secret, which is not a flag (every user of the host can read"
                " argv): set it in KASCADE_KAFKA__EXTRA or under [kafka.extra] in --config"
            )
    return text


def _field_at(model: type[BaseModel], dest: str) -> FieldInfo | None:
    field = None
    for name in dest.split("."):
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(name)
        if field is None:
            return None
        model = field.annotation  # type: ignore[assignment]  # a section's class, checked above
    return field


def describe_flag(field: FieldInfo) -> tuple[str, str | None]:
    r"""A flag's help (its description and true default, values as the flag takes them)
    and its metavar where pydantic-settings' is not what to type.

    >>> from kascade.schemas.events import InputSettings
    >>> from kascade.schemas.kafka import KafkaSettings
    >>> from kascade.schemas.settings import Settings
    >>> describe_flag(Settings.model_fields["aggregation"])[1]
    '{token_mean,max,majority}'
    >>> print(describe_flag(InputSettings.model_fields["separator"])[0])
    Between the texts of several paths. (default: '\n\n')
    >>> help, metavar = describe_flag(KafkaSettings.model_fields["extra"])
    >>> help.endswith("never shown. (default: none)"), metavar
    (True, 'KEY=VALUE,...')
    """
    default = field.get_default(call_default_factory=True)
    kinds = [a for a in (field.annotation, *get_args(field.annotation)) if a is not type(None)]
    enum = next((k for k in kinds if isinstance(k, type) and issubclass(k, Enum)), None)
    metavar = None
    if enum is not None:
        metavar = "{" + ",".join(str(m.value) for m in enum) + "}"
    elif any(get_origin(k) is dict for k in kinds):
        metavar = "KEY=VALUE,..."
    elif any(get_origin(k) is list for k in kinds):
        metavar = "VALUE,..."
    if isinstance(default, Enum):
        shown = str(default.value)
    elif default is None or default == {} or default == []:
        shown = "none"
    elif isinstance(default, bool):
        shown = str(default).lower()
    elif isinstance(default, list):
        shown = ",".join(map(str, default))
    elif isinstance(default, str) and (not default.strip() or default != default.strip()):
        shown = repr(default)
    else:
        shown = str(default)
    text = f"{field.description or ''} (default: {shown})".strip()
    return text.replace("%", "%%"), metavar


def add_alias(parser: argparse.ArgumentParser, flag: str, alias: str) -> None:
    """``alias`` as a second spelling of the generated ``flag`` (a short form).

    >>> from pydantic_settings import BaseSettings
    >>> class Knobs(BaseSettings):
    ...     max_tokens: int = 256
    >>> p = argparse.ArgumentParser()
    >>> source = flags_for(Knobs, p)
    >>> add_alias(p, "--max-tokens", "--tokens")
    >>> vars(p.parse_args(["--tokens", "64"]))
    {'max_tokens': '64'}
    """
    action = next(a for a in parser._actions if flag in a.option_strings)
    action.option_strings = [*action.option_strings, alias]
    parser._option_string_actions[alias] = action
