"""Stage 2: the model optimised up to ``FuseOps``, as upstream's VM pass prefix leaves it.

``pipeline`` runs the prefix; ``fold`` folds constants, in numpy where ``evaluate`` has the
operator (bit-identical to TVM's ``FoldConstant``), large results deferred (``placeholders``)
until something reads them; ``simplify`` and ``gates`` skip or narrow the passes that would rewrite
nothing; ``region`` runs a pass on a cut of the graph and splices the result back.
"""
