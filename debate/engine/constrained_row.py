"""One batch row decoded under its schema: drives debate.engine.schema_program's program token by token.

The generator (and the reference path) feed a row's logits in and get the id it feeds next; how a
choice's candidates are scored is theirs to say (`score`), since it depends on how the context is held.
A generated number needs nothing but the row's logits: each step samples among the ids its value trie
allows there, with the role's own settings (debate.engine.sampling), so it costs one step per token.
"""
from typing import Any, Callable, List, Optional, Sequence, Tuple

import torch

from debate.engine import schema_program
from debate.engine.sampling import host_pick, next_tokens


def resumed(program: Any, value: Any) -> Tuple[Any, Any]:
    """(the program's next op, None) after sending it `value`, or (None, its result) once it has returned."""
    try:
        return program.send(value), None
    except StopIteration as done:
        return None, done.value


class SchemaRow:
    """Drives one row's schema program (debate.engine.schema_program.program) step by step: forced ids one per step,
    masked free text, numbers sampled inside their value trie, whole-value choices scored by
    `score(candidates, logits) -> totals`."""

    def __init__(self, compiled: Any, limit: int, masks: Any, settings: Any, generator: Optional[torch.Generator],
                 score: Callable[[Any, torch.Tensor], List[float]]) -> None:
        self.program = schema_program.program(compiled, limit)
        self.masks, self.settings, self.generator, self.score = masks, settings, generator, score
        self.queue: List[int] = []
        self.text: List[int] = []
        self.cap, self.mode, self.result = 0, None, None
        self._send(None)

    def _send(self, value: Any) -> None:
        self.op, self.result = resumed(self.program, value)
        if self.op is None:
            return
        if self.op[0] == "force":
            self.queue = list(self.op[1])
        elif self.op[0] == "text":
            _, self.cap, self.mode = self.op
            self.text = []
        elif self.op[0] == "generate":
            self.node = self.op[1]

    def _generate(self, logits: torch.Tensor) -> Optional[int]:
        """The next id of a number in its trie, or None once its closing id is picked (the value's index is
        then sent: the schema forces the closing id, which the trie and the schema spell alike)."""
        options = list(self.node)
        if len(options) == 1:
            token = options[0]  # the only way on: no draw needed
        else:
            allowed = torch.tensor(options, device=logits.device)
            masked = torch.full_like(logits, float("-inf"))
            masked[allowed] = logits[allowed]
            token = int(next_tokens(masked[None], self.settings, self.generator)[0])
        self.node = self.node[token]
        if isinstance(self.node, int):
            self._send(self.node)
            return None
        return token

    def _choose(self, candidates: Any, logits: torch.Tensor) -> Tuple[int, List[float]]:
        totals = torch.tensor(self.score(candidates, logits))
        probs = torch.softmax(totals, dim=0)
        if self.settings.temperature <= 0:
            index = int(totals.argmax())
        else:
            tempered = torch.softmax(totals / self.settings.temperature, dim=0).to(logits.device)
            index = int(torch.multinomial(tempered, 1, generator=self.generator))
        return index, [round(float(p), 6) for p in probs]

    def next_token(self, logits: torch.Tensor) -> Optional[int]:
        """The id this row feeds now, given its logits; None once the object is complete."""
        while self.op is not None:
            kind = self.op[0]
            if kind == "force":
                if not self.queue:
                    self._send(None)
                    continue
                token = self.queue.pop(0)
                if not self.queue:
                    self._send(None)  # the next op starts at the next step, from that step's logits
                return token
            if kind == "choose":
                self._send(self._choose(self.op[1], logits))
                continue
            if kind == "generate":
                generated = self._generate(logits)
                if generated is None:
                    continue
                return generated
            if self.cap <= 0:
                self._send(self.text)
                continue
            banned, closing = self.masks[self.mode]
            token = int(next_tokens(logits.masked_fill(banned, float("-inf"))[None], self.settings,
                                     self.generator)[0])
            if closing[token]:
                self._send(self.text)  # the closing token itself is not fed: the schema writes the close
                continue
            self.text.append(token)
            self.cap -= 1
            return token
        return None




class Plan:
    """What a schema row's device state runs next, without the host: `queue`, ids fed one a step; then `text`
    (a mode's name and a cap: sample under the mode's mask until a closing token or the cap) or, when None, wait
    for the host (a choice or a number needs it) at the logits after the queue's last id. `done`: the queue ends
    the reply (its last id is a stop id)."""

    def __init__(self, queue: List[int], text: Optional[Tuple[str, int]] = None, done: bool = False) -> None:
        self.queue, self.text, self.done = queue, text, done


class SchemaDriver:
    """One row's schema program (schema_program.program) split between the device and the host, for the batch
    (debate.engine.decode_batch): forced ids and masked free text run on the device from a Plan; the host takes
    over only where the program needs it (a choice scored as whole values, a number's next allowed tokens, the end of
    a text), from the logits the device held for it. The same program and the same choices as SchemaRow, which
    drives it token by token (the reference path).

    `score(candidates, logits) -> totals` scores a choice; `draw(values, ids, count)` picks among ids from their
    logits (debate.engine.sampling.host_pick with the row's stream), `count` the draw's number."""

    def __init__(self, compiled: Any, limit: int, stop_id: int, settings: Any, key: int,
                 score: Callable[[Any, torch.Tensor], List[float]]) -> None:
        self.program = schema_program.program(compiled, limit)
        self.stop_id, self.settings, self.key, self.score = stop_id, settings, key, score
        # where the free text the device writes starts in the reply's ids, while it writes
        self.text_from: Optional[int] = None
        self.result: Any = None
        self.op: Any = None
        self._send(None)

    def _send(self, value: Any) -> None:
        self.op, self.result = resumed(self.program, value)

    def _choose(self, candidates: Any, logits: torch.Tensor, count: int) -> Tuple[int, List[float]]:
        # As SchemaRow: the totals as float32 (the greedy pick among them, ties to the first), their softmax.
        totals = torch.tensor(self.score(candidates, logits))
        index = host_pick(totals.tolist(), list(range(len(totals))), self.settings.temperature, 1.0, self.key, count)
        return index, [round(p, 6) for p in torch.softmax(totals, dim=0).tolist()]

    def plan(self, logits: Optional[torch.Tensor], ids: Sequence[int]) -> Plan:
        """The next Plan: at the start `logits` is None (the first op needing logits waits for the prefill's);
        after a wait, the logits held for it. `ids`: the reply's ids so far (the host's copy of what the device
        picked)."""
        queue: List[int] = []
        while self.op is not None:
            kind = self.op[0]
            if kind == "force":
                queue += self.op[1]
                self._send(None)
            elif kind == "text":
                if self.text_from is not None:  # the device's text ended (a closing id, or its cap)
                    text, self.text_from = list(ids[self.text_from:]), None
                    self._send(text)
                elif self.op[1] <= 0:
                    self._send([])
                else:
                    self.text_from = len(ids) + len(queue)
                    return Plan(queue, (self.op[2], self.op[1]))
            elif queue or logits is None:
                return Plan(queue)  # the host's turn, at the logits after the queue
            elif kind == "choose":
                self._send(self._choose(self.op[1], logits, len(ids)))
            else:  # generate: one id of a number, then the host again at the next logits
                options = sorted(self.op[1])
                if len(options) == 1:
                    token = options[0]
                else:
                    values = logits[torch.tensor(options, device=logits.device)].tolist()
                    token = options[host_pick(values, options, self.settings.temperature, self.settings.top_p,
                                              self.key, len(ids))]
                self.op = ("generate", self.op[1][token])
                if isinstance(self.op[1], int):
                    self._send(self.op[1])  # the value is complete: its closing id is forced next
                    continue
                return Plan([token])
        return Plan(queue + [self.stop_id], done=True)
