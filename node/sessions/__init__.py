"""Chat sessions and warm-ahead: the session store, a session's turns, the template cuts that
find where later requests diverge, and prefilling a prompt into the prefix cache."""
