"""One batch row decoded under its schema: drives debate.engine.schema_program's program token by token.

The generator (and the reference path) feed a row's logits in and get the id it feeds next; how a
choice's candidates are scored is theirs to say (`score`), since it depends on how the context is held.
A generated number needs nothing but the row's logits: each step samples among the ids its value trie
allows there, with the role's own settings (debate.engine.sampling), so it costs one step per token.
"""
import torch

from debate.engine import schema_program
from debate.engine.sampling import next_tokens


class SchemaRow:
    """Drives one row's schema program (debate.engine.schema_program.program) step by step: forced ids one per step,
    masked free text, numbers sampled inside their value trie, whole-value choices scored by
    `score(candidates, logits) -> totals`."""

    def __init__(self, compiled, limit, masks, settings, generator, score):
        self.program = schema_program.program(compiled, limit)
        self.masks, self.settings, self.generator, self.score = masks, settings, generator, score
        self.queue, self.text, self.cap, self.mode, self.result = [], [], 0, None, None
        self._send(None)

    def _send(self, value):
        try:
            self.op = self.program.send(value)
        except StopIteration as done:
            self.op, self.result = None, done.value
            return
        if self.op[0] == "force":
            self.queue = list(self.op[1])
        elif self.op[0] == "text":
            _, self.cap, self.mode = self.op
            self.text = []
        elif self.op[0] == "generate":
            self.node = self.op[1]

    def _generate(self, logits):
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

    def _choose(self, candidates, logits):
        totals = torch.tensor(self.score(candidates, logits))
        probs = torch.softmax(totals, dim=0)
        if self.settings.temperature <= 0:
            index = int(totals.argmax())
        else:
            tempered = torch.softmax(totals / self.settings.temperature, dim=0).to(logits.device)
            index = int(torch.multinomial(tempered, 1, generator=self.generator))
        return index, [round(float(p), 6) for p in probs]

    def next_token(self, logits):
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
                token = self._generate(logits)
                if token is None:
                    continue
                return token
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


