"""The start-time check that every llama.cpp role has a chat template (layer 8, reads files).

A GGUF without ``tokenizer.chat_template`` (such as the packaged Gemma 3 270M) makes
llama-server fall back to ChatML, and a model trained on another template then answers
chat requests with ChatML's markers in its text (``<|im_end|>user ...``): the answer looks
broken and nothing says why. ``rosterd up`` warns once at start for each such role,
unless the fleet sets a template (``--chat-template`` or ``--chat-template-file`` in the
model's ``extra_args``).
"""

from __future__ import annotations

from rosterd.backends.node_host import weights_resolver
from rosterd.errors import RosterdError
from rosterd.flavors import WeightsKind
from rosterd.fleet_scheduler.values import ServedConfig
from rosterd.model_facts.gguf_file import read_gguf_header
from rosterd.up.config import serving_facts

#: The llama-server options that set a chat template; any of them in ``extra_args`` counts.
TEMPLATE_OPTIONS = ("--chat-template", "--chat-template-file")


def missing_template_warnings(config: ServedConfig) -> list[str]:
    """One warning per llama.cpp role of ``config`` whose GGUF has no
    ``tokenizer.chat_template`` and whose fleet entry sets none, naming the role and the
    file and what to set. Roles whose weights cannot be found or read are left to the
    checks that report those (they are ``unavailable``)."""
    resolve = weights_resolver(serving_facts(config))
    warnings: list[str] = []
    for role, imported in sorted(config.first_by_role().items()):
        gguf = imported.spec.flavor.facts.weights is WeightsKind.GGUF_FILE
        if not gguf or role in config.unavailable_here:
            continue
        try:
            source = resolve(imported.spec)
        except RosterdError:
            continue
        if source.path.suffix != ".gguf":
            continue
        if any(arg.split("=", 1)[0] in TEMPLATE_OPTIONS for arg in source.extra_args):
            continue
        try:
            values, _ = read_gguf_header(source.path)
        except (OSError, RosterdError, ValueError):
            continue
        if isinstance(values.get("tokenizer.chat_template"), str):
            continue
        warnings.append(
            f"role {role}: {source.path} has no tokenizer.chat_template and the fleet sets "
            "none, so llama-server falls back to ChatML and its chat answers may hold "
            "template markers; set one on its entry of the fleet file's models: section, "
            "e.g. extra_args: [--no-jinja, --chat-template, gemma] (llama-server --help lists "
            "the built-in names; without --no-jinja it takes the name for a Jinja template)"
        )
    return warnings
