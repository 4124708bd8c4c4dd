"""The decoder (`loop.py`) and its one loop (`session.py`: draft, build a tree, score, verify, commit), and
the adaptive planner that sizes each step's tree from measured costs and predicted acceptance."""
