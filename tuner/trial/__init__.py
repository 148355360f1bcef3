"""One config end to end: pre-screen, memory estimate, staged run, runners."""
