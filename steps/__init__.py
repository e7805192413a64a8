"""The step library (tokenize, mixture, train_moe, evaluate): step functions and their configs."""
