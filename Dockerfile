FROM python:3.11-slim
WORKDIR /app
# CPU build by default; on GPU hosts build with --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir --index-url ${TORCH_INDEX} torch==2.13.0
COPY . .
RUN pip install --no-cache-dir .
CMD ["parallab", "up", "--host", "0.0.0.0"]
