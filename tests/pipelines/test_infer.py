"""`swift infer`: batch mode to jsonl, and the interactive chat driven through a pseudo-terminal."""
import json
import os
import sys

import pexpect

from swift.pipelines.infer import infer_main


def test_batch_mode_writes_rows_and_summary(tmp_path):
    data = tmp_path / "val.jsonl"
    data.write_text("".join(json.dumps({"query": f"{i}+1=", "response": str(i + 1)}) + "\n" for i in range(6)))
    out = tmp_path / "res" / "out.jsonl"
    summary = infer_main(["--model", "builtin:tiny-chat", "--val_dataset", str(data), "--metric", "rouge",
                          "--result_path", str(out), "--max_new_tokens", "4"])
    rows = [json.loads(line) for line in open(out)]
    assert len(rows) == 6 and summary["num_rows"] == 6
    assert rows[0]["reference"] == "1" and rows[0]["messages"] == [{"role": "user", "content": "0+1="}]
    assert all("rouge" in r and "response" in r for r in rows)
    assert summary["rouge"] == sum(r["rouge"] for r in rows) / 6
    assert json.load(open(tmp_path / "res" / "out_summary.json")) == summary


def test_interactive_chat_in_a_terminal():
    child = pexpect.spawn(sys.executable, ["-m", "swift", "infer", "--model", "builtin:tiny-chat",
                                           "--max_new_tokens", "5"], encoding="utf-8", timeout=120,
                          env={**os.environ, "TERM": "dumb"})
    child.expect("<<< ")
    child.sendline("12+34=")
    child.expect(">>> ")
    child.expect("<<< ")
    child.sendline("clear")
    child.expect(r"\(conversation cleared\)")
    child.expect("<<< ")
    child.sendline("reset-system")
    child.expect("new system prompt: ")
    child.sendline("Answer with digits only.")
    child.expect("<<< ")
    child.sendline("multi-line")
    child.expect(r"<<<\[M\] ")
    child.sendline("first line")
    child.sendline("second line#")
    child.expect(">>> ")
    child.expect(r"<<<\[M\] ")
    child.sendline("exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
