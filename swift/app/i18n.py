"""Every label of `swift app` and `swift web-ui`, in English and Chinese (`--lang en|zh`)."""
from __future__ import annotations

LANGS = ("en", "zh")

LABELS: dict[str, tuple[str, str]] = {
    # the chat page
    "title": ("swift chat", "swift 对话"),
    "system": ("System prompt", "系统提示词"),
    "chatbot": ("Conversation", "对话"),
    "message": ("Message", "消息"),
    "placeholder": ("Type a message and press Enter", "输入消息后按回车"),
    "send": ("Send", "发送"),
    "stop": ("Stop", "停止"),
    "regenerate": ("Regenerate", "重新生成"),
    "clear": ("Clear", "清空"),
    "settings": ("Generation settings", "生成参数"),
    "temperature": ("Temperature", "温度"),
    "top_p": ("Top-p", "Top-p"),
    "max_new_tokens": ("Max new tokens", "最大生成长度"),
    "adapter": ("Adapter", "适配器"),
    "base_model": ("(base model)", "（基础模型）"),
    "error": ("Error", "错误"),
    "no_model": ("no model is loaded: pick a finished run in Runs and press “Chat with this run's model”",
                 "未加载模型：请在“运行列表”中选择已完成的运行，并点击“与该运行的模型对话”"),
    # the console
    "console_title": ("swift web-ui", "swift 训练控制台"),
    "launch_tab": ("Launch", "启动"),
    "runs_tab": ("Runs", "运行列表"),
    "chat_tab": ("Chat", "对话"),
    "extra_flags": ("Other flags", "其他参数"),
    "extra_placeholder": ("--flag value --other_flag value", "--参数 值 --其他参数 值"),
    "command": ("Command it will run", "将要运行的命令"),
    "preview": ("Check", "检查"),
    "launch": ("Launch", "启动"),
    "launched": ("Launched", "已启动"),
    "run": ("Run", "运行"),
    "status": ("Status", "状态"),
    "progress": ("Progress", "进度"),
    "log": ("Log (last lines)", "日志（最后几行）"),
    "curves": ("Curves (logging.jsonl)", "曲线（logging.jsonl）"),
    "stop_run": ("Stop this run", "停止该运行"),
    "chat_with_run": ("Chat with this run's model", "与该运行的模型对话"),
    "chat_model": ("Model in the chat", "对话中的模型"),
    "no_runs": ("No runs yet.", "暂无运行。"),
    "runs_table": ("All runs", "全部运行"),
}


def label(key: str, lang: str) -> str:
    return LABELS[key][LANGS.index(lang)]
