"""multiply: the product of two numbers. Arguments: {"a": number, "b": number}."""

from _common import number, read_args, reply

args = read_args()
reply({"result": number(args, "a") * number(args, "b")})
