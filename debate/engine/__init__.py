"""The engine wing: everything that turns conversations into tokens on a device.

Loading checkpoints (models), the chat template (chat), each conversation's KV cache (kv_store), prefill and
decode of a batch (generator), sampling, structured decoding of a declared schema (schema_program, constrained_row), the
memory budget (ram: what a CPU has left) and the entry every method calls (engine.generate), continuous
batching across claims (scheduler), the plain reference path the tests hold the engine to (reference), and
the dense retriever (retrieval: the sentence encoder and its index).

May import: debate.data. Never debate.methods or debate.pipeline.
"""
