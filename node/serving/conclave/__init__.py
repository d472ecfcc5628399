"""The Conclave: best-of-N consensus over forks of one prefill, decided by a vote.

vote.py holds the vote (answer keys, majority, plurality, the ROUGE-L medoid), runner.py
runs the candidates on the engine and stops the losers, select.py picks OpenAI's `best_of`
by mean token log-probability on the same forks.
"""
