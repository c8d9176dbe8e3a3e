"""Draft trees as data and as masks: a static tree and the best one for measured accuracies (`static`),
the trees of one step, one per row (`row_trees`), trees grown per row and step (`dynamic`), 4D attention
masks (`masks`), and prompt lookup's continuation grafted onto each row's tree (`lookup_graft`).
"""
