"""The course's own tools, which no lesson imports: the lesson catalogue (``catalogue``: what a
lesson is, its metadata, the README's run-time table), the lab launcher (``lab``), the handout
that runs and renders the course (``handout``), the swapping-in of reference answers
(``answers``), the GPU memory each lesson needs, counted on a CPU (``memory``, with what it
runs inside a lesson's kernel in ``live_memory``), the list of graded exercises and mistake keys
the workshop hub's progress service takes (``exercise_manifest``), and the check a lent GPU runs
(``gpu_check``: each lesson through ``lesson_exec``, which needs no Jupyter, the machine's facts
and probes in ``gpu_probes``, the verdicts into docs/gpu-register.md with ``gpu_register``)."""
