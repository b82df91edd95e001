"""A chat template: ChatML with a fixed system prompt (a subclass of a built-in format).

    swift sft --external_plugins examples/plugins/template.py --template chatml_terse ...
"""
from swift.plugin import register
from swift.template.formats import ChatMLTemplate


@register("template", "chatml_terse")
class ChatMLTerse(ChatMLTemplate):
    name = "chatml_terse"
    default_system = "Answer with the result only."
