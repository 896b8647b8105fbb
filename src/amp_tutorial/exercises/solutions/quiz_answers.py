# Answers to the core quiz in notebooks/06_exercise_train_with_amp.py (the test run uses them).
answers = {1: "b", 2: "b", 3: "a", 4: "c", 5: "c", 6: "a",  # lessons 01-02
           7: "d", 8: "b", 9: "d", 10: "c"}  # lessons 03-05
