"""Plain records: the words every other layer speaks (errors, kinds, proposals, trees, scores, costs, sampling
parameters, stop strings, metrics). This layer imports nothing else from specframe."""
