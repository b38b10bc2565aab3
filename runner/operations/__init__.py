"""Operations on runs: control verbs, retention (prune), migration, forks and inspection
through a replay that calls nothing, and timelines."""
