"""The graded exercises: one module per exercise, each with its checker, on shared parts.

``checking`` runs the learner's code (time limit, errors, wrong return types) and formats the
problems it names; ``training_spy`` watches training code run (autocast, backward, GradScaler and
optimizer calls). Each exercise module holds its small CPU problem, its scenarios and its rules.
"""
