"""kascade's benchmark harness: scripts that measure the four claims on this machine."""
