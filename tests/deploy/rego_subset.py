"""A small interpreter of the Rego forms api/orchestrator/agent_policy.py generates, with the Kata
agent's semantics: the agent asks the value of the rule named after the request (`CreateContainerRequest`,
...) for the request as `input`; it is allowed only when that value is true. A rule is true when one of
its bodies holds, else its `default`; a rule with no default is undefined, which the agent refuses.

No Rego engine (OPA, regorus) is installed here, so the tests read the generated text with this.
It knows exactly these forms, and fails (AssertionError) on any other line rather than guess:

    NAME := <JSON>                               constants (worker, pause_args, per_pod_env)
    default NAME := true|false
    NAME if { LINE... }                          a body: every line must hold
    helper(var) if { LINE... }                   a helper rule taking one argument
    TERM == TERM                                 TERM: input.<path>, var.<path>, a constant, JSON,
    startswith(TERM, TERM) / not contains(TERM, TERM)      or array.concat(TERM, TERM)
    TERM in TERM                                 membership in an array
    some var in TERM                             then the following lines, for some element
    every var in TERM { LINE }                   LINE for every element (an absent array: none)
    helper(TERM)
"""

from __future__ import annotations

import json
import re
from typing import Any


class Policy:
    def __init__(self, text: str) -> None:
        self.text = text
        self.values = {k: json.loads(v) for k, v in re.findall(r"^(\w+) := (\S.*)$", text, re.M)}

    def bodies(self, name: str) -> list[tuple[str | None, list[str]]]:
        found = re.findall(rf"^{name}(?:\((\w+)\))? if {{\n(.*?)\n}}", self.text, re.M | re.S)
        return [(param or None, [line.strip() for line in body.splitlines() if line.strip()])
                for param, body in found]

    def term(self, expr: str, inp: Any, env: dict[str, Any]) -> Any:
        expr = expr.strip()
        if expr.startswith("array.concat("):
            a, b = _split_args(expr[len("array.concat("):-1])
            return self.term(a, inp, env) + self.term(b, inp, env)
        head = re.match(r"\w+", expr)
        if head is None:
            return json.loads(expr)
        name, rest = head.group(0), expr[head.end():]
        if name == "input":
            node = inp
        elif name in env:
            node = env[name]
        elif name in self.values:
            node = self.values[name]
        else:
            return json.loads(expr)
        for part in re.findall(r'\.(\w+)|\["([^"]+)"\]', rest):
            node = node.get(part[0] or part[1]) if isinstance(node, dict) else None
        return node

    def lines_hold(self, lines: list[str], inp: Any, env: dict[str, Any]) -> bool:
        if not lines:
            return True
        line, rest = lines[0], lines[1:]
        if m := re.fullmatch(r"some (\w+) in (.+)", line):
            domain = self.term(m.group(2), inp, env) or []
            return any(self.lines_hold(rest, inp, {**env, m.group(1): item}) for item in domain)
        return self.holds(line, inp, env) and self.lines_hold(rest, inp, env)

    def holds(self, line: str, inp: Any, env: dict[str, Any]) -> bool:
        if m := re.fullmatch(r"every (\w+) in (\S+) \{ (.+) \}", line):
            domain = self.term(m.group(2), inp, env) or []
            return all(self.holds(m.group(3), inp, {**env, m.group(1): item}) for item in domain)
        if m := re.fullmatch(r"(not )?(startswith|contains)\((.+)\)", line):
            a, b = (self.term(t, inp, env) for t in _split_args(m.group(3)))
            if not (isinstance(a, str) and isinstance(b, str)):
                return False  # undefined: the expression does not hold, and `not` of it is not asked here
            result = a.startswith(b) if m.group(2) == "startswith" else b in a
            return result != bool(m.group(1))
        if m := re.fullmatch(r"(\w+)\((\S+)\)", line):
            value = self.term(m.group(2), inp, env)
            helpers = self.bodies(m.group(1))
            assert helpers, f"no helper rule {m.group(1)}"
            return any(self.lines_hold(body, inp, {param: value} if param else {}) for param, body in helpers)
        if " == " in line:
            lhs, rhs = line.split(" == ", 1)
            return bool(self.term(lhs, inp, env) == self.term(rhs, inp, env))
        if " in " in line:
            lhs, rhs = line.split(" in ", 1)
            domain = self.term(rhs, inp, env)
            return isinstance(domain, list) and self.term(lhs, inp, env) in domain
        raise AssertionError(f"the interpreter does not know this form: {line!r}")


def _split_args(text: str) -> list[str]:
    """Two arguments split at the top-level comma (strings and brackets may hold commas)."""
    depth, quoted = 0, False
    for i, ch in enumerate(text):
        if ch == '"' and (i == 0 or text[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "([{":
            depth += 1
        elif not quoted and ch in ")]}":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            return [text[:i].strip(), text[i + 1:].strip()]
    raise AssertionError(f"expected two arguments: {text!r}")


def evaluate(text: str, request: str, inp: dict[str, Any]) -> bool:
    """The Kata agent's answer to `request` with `inp`: true only when the rule's value is true."""
    policy = Policy(text)
    default = re.search(rf"^default {request} := (true|false)$", text, re.M)
    assert default is not None, f"{request} has no default: the agent refuses an undefined rule"
    if any(param is None and policy.lines_hold(body, inp, {}) for param, body in policy.bodies(request)):
        return True
    return default.group(1) == "true"
