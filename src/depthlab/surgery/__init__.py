"""Model surgery: the commands that cut blocks out of a model or run a span of them twice, and save the result as a
stock Hugging Face model. Above both packages it joins: analysis says which blocks (an analysis's ranking, or greedy
removal scored as `analyze` scores it), hf does the cutting (depthlab.hf.pruning).

    choice.py   which blocks: the k least useful by an analysis's metrics.json, or greedily (`greedy_record`)
    cli.py      `depthlab prune | duplicate`
"""
