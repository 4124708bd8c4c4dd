# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   execution:
#     timeout: 900
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Tree builders: shapes and masks
#
# A drafter proposes a *candidate forest*; a tree builder cuts it down to at most `budget` nodes, closed
# under parents, and the target scores that tree in one forward pass. This notebook takes one real
# forest, drafted by the first 8 layers of SmolLM2-135M (`draft-model(layers=8, topk=3)`), cuts it with
# every registered tree builder, and draws each tree next to the attention mask the backend will use.

# %%
import matplotlib.pyplot as plt
import numpy as np

import specframe
from specframe import BuildContext, DraftContext

registry = specframe.get_registry()
print("tree builders:", registry.names("tree builder"))

# %%
target = specframe.load_target("smollm2-135m")
tok = target.tokenizer
prompt = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci("
ids = np.array(tok(prompt)["input_ids"])

drafter = registry.get("drafter", "draft-model")(target, layers=8, num_tokens=4, topk=3)
proposal = drafter.propose(DraftContext(ids, prompt_len=len(ids), budget=16))
print(f"{len(proposal)} candidates; draw = {proposal.draw.value}; "
      f"draft_probs {tuple(proposal.draft_probs.shape)}")
for i in range(len(proposal)):
    print(f"node {i:2d} parent {proposal.parents[i]:2d} {tok.decode([proposal.tokens[i]])!r:12} "
          f"log q(path) = {proposal.scores[i]:.2f}")


# %% [markdown]
# Each builder gets the same proposal and a `BuildContext` capping the tree at 8 nodes (a builder may keep
# fewer; these five fill the cap). `chain` follows the best child only;
# `trie` keeps the best-scored nodes; `static` follows a fixed shape of ranks; `beam` keeps the best
# `width` nodes per depth; `dynamic` expands the best nodes and reranks globally (EAGLE-2).

# %%
def draw_tree(ax, tree, title):
    """Nodes at x = depth, spread vertically; the root at x = 0."""
    ys = {-1: 0.0}
    order = {d: 0 for d in range(0, int(tree.depth.max(initial=0)) + 1)}
    for i in range(len(tree)):
        d = int(tree.depth[i])
        ys[i] = -order[d]
        order[d] += 1
    for i in range(len(tree)):
        p = int(tree.parents[i])
        ax.plot([tree.depth[p] if p >= 0 else 0, tree.depth[i]], [ys[p], ys[i]], color="0.6", zorder=1)
    ax.scatter([0], [0], s=300, color="black", zorder=2)
    for i in range(len(tree)):
        ax.scatter([tree.depth[i]], [ys[i]], s=300, color="tab:blue", zorder=2)
        ax.annotate(tok.decode([tree.tokens[i]]).replace("\n", "\\n"), (tree.depth[i], ys[i]),
                    xytext=(8, 4), textcoords="offset points", fontsize=8)
    ax.set_title(title)
    ax.axis("off")


builders = {"chain": "chain", "trie": "trie", "static": "static(preset=continuous, depth=3, width=3)",
            "beam": "beam(width=2, depth=4)", "dynamic": "dynamic(topk=3, depth=4)"}
trees = {}
for name, spec in builders.items():
    parsed = specframe.ComponentSpec.parse(spec)
    trees[name] = registry.get("tree builder", parsed.name)(**parsed.options).build(proposal, BuildContext(8))

fig, axes = plt.subplots(2, len(trees), figsize=(4 * len(trees), 7))
for col, (name, tree) in enumerate(trees.items()):
    draw_tree(axes[0, col], tree, f"{builders[name]}\n{len(tree)} nodes")
    axes[1, col].imshow(tree.ancestor_mask, cmap="Blues")
    axes[1, col].set_title("ancestor mask (row attends to column)")
    axes[1, col].set_xlabel("packed index (0 = root)")
plt.tight_layout()
plt.show()

# %% [markdown]
# Every tree is a sub-forest of the proposal (each node spells a path the drafter proposed), within the
# budget, and its mask is lower triangular: each packed entry sees the root, its ancestors and itself.

# %%
from specframe.testing import check_tree

for name, tree in trees.items():
    check_tree(tree, proposal, budget=8, name=name)
    mask = tree.ancestor_mask
    assert np.array_equal(mask, np.tril(mask)) and mask[:, 0].all()
    print(f"{name:8} nodes={len(tree)} depth={int(tree.depth.max(initial=0))} paths={len(tree.paths)}")
