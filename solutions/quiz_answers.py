# Answers to the quiz in notebooks/06_exercise_train_with_amp.py (the test run uses them).
answers = {1: "b", 2: "b", 3: "a", 4: "c", 5: "c", 6: "a",
           7: "a", 8: "c", 9: "d", 10: "b", 11: "c", 12: "c", 13: "a", 14: "d", 15: "b", 16: "c",
           17: "a"}
