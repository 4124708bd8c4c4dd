"""The plugin contract: the four interfaces (Drafter, TreeBuilder, Verifier, StateBackend), the bench peer
interface (Peer), the pluggy hook specifications, and the extension records (CLI options, model recipes,
presets) plugins register."""
